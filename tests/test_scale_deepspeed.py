"""DeepSpeed ZeRO as a trainer backend on CPU, for real (the ``deepspeed`` package of
``.venv-scale``; elsewhere these skip): the torch backend's losses and weights reached, checkpoints,
rank 0 alone copying weights to the host, only device tensors handed to collectives, gradient
checkpointing, LoRA refused, the GPU template's ZeRO-3 bf16 ranks resumed through the driver. Every
trainer runs in a Ray actor, as in a job."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from graftpool.step_record import StepRecord
from graftpool.tasks import generate_problems
from orchestrator.cluster.model_actors import join_process_group
from orchestrator.controller.exchange import concat_shares
from tests.scale_setup import (
    needs_deepspeed,
)
from tests.tiny_pair import batch_of, prepared
from workers.training.trainer import TorchTrainer, trainer_class

pytestmark = pytest.mark.slow


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
@pytest.mark.parametrize(("zero_stage", "grad_accum", "world_size"),
                         [(2, 1, 1), (3, 2, 1), (2, 1, 2), (3, 1, 2), (2, 3, 2)])  # 2-3-2: ranks with unlike graphs
def test_deepspeed_reaches_the_torch_backends_losses_and_weights(ray_local, h64_path, h64_groups, zero_stage,
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
    expected = _train_steps(lambda m, *a: getattr(reference, m)(*a), h64_groups, 3)

    # stage 3: every weight partitioned and gathered (DeepSpeed's default leaves a tiny model's whole)
    partitioned = {"param_persistence_threshold": 0} if zero_stage == 3 else {}
    ranks, call = _deepspeed_ranks(ray_local, h64_path, world_size, deepspeed={"zero_stage": zero_stage, **partitioned},
                                   grad_accum=grad_accum, **args)
    losses = _train_steps(call, h64_groups, 3)
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
def test_deepspeed_checkpoint_resumes_the_same_update(ray_local, h64_path, h64_groups, tmp_path):
    """DeepSpeed's own save/load: weights, the ZeRO-partitioned AdamW state, version and RNG."""
    args = dict(lr=1e-3, minibatches=2, seed=0, deepspeed={"zero_stage": 2})
    ranks, call = _deepspeed_ranks(ray_local, h64_path, 1, **args)
    _train_steps(call, h64_groups, 1)
    call("save", str(tmp_path / "ckpt"))
    later = copy.deepcopy(h64_groups)
    _train_steps(call, later, 1)
    expected = ray_local.get(ranks[0].state_dict.remote())

    resumed, call2 = _deepspeed_ranks(ray_local, h64_path, 1, **args)
    assert call2("load", str(tmp_path / "ckpt")) == 1
    _train_steps(call2, copy.deepcopy(h64_groups), 1)
    weights = ray_local.get(resumed[0].state_dict.remote())
    for name, value in expected.items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=0, msg=name)
    for t in [*ranks, *resumed]:
        ray_local.kill(t)


@needs_deepspeed
def test_deepspeed_ranks_hand_their_checkpoint_through_the_driver(ray_local, h64_path, h64_groups, tmp_path):
    """Without a shared disk (``orchestrator.controller.node_layout``): two ZeRO-2 ranks each save
    into a private folder of their own and return the files in chunks (``NodeFiles.save_files``),
    which the driver writes into its folder; two new ranks load all of them (``load_files``) and
    make the same next update, bit for bit."""
    from workers.file_chunks import get_files, put_files

    args = dict(lr=1e-3, minibatches=2, seed=0, deepspeed={"zero_stage": 2})
    ranks, call = _deepspeed_ranks(ray_local, h64_path, 2, **args)
    _train_steps(call, h64_groups, 1)
    names: list[str] = []
    for rank_files in ray_local.get([t.save_files.remote() for t in ranks]):
        get_files(rank_files, tmp_path)  # the driver's copy (the chunks are the ranks' objects)
        names += rank_files
    assert {n.split("/")[-1] for n in names if "optim_states" in n} == \
        {f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(2)}  # each rank's partition came back
    _train_steps(call, copy.deepcopy(h64_groups), 1)
    expected = ray_local.get(ranks[0].state_dict.remote())
    for t in ranks:
        ray_local.kill(t)

    resumed, call2 = _deepspeed_ranks(ray_local, h64_path, 2, **args)
    files = put_files(tmp_path)
    assert ray_local.get([t.load_files.remote(files) for t in resumed]) == [1, 1]
    _train_steps(call2, copy.deepcopy(h64_groups), 1)
    weights = ray_local.get(resumed[0].state_dict.remote())
    for name, value in expected.items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=0, msg=name)
    for t in resumed:
        ray_local.kill(t)


@needs_deepspeed
def test_zero3_bf16_ranks_resume_from_files_handed_through_the_driver(ray_local, h64_path, h64_groups, tmp_path):
    """The GPU template's trainers (ZeRO-3, every weight partitioned, the engine's bf16 over fp32
    masters) without a shared disk: each rank saves into a folder of its own, the driver collects
    the files, two new ranks load them and make the same next update, losses and weights bit for bit."""
    from workers.file_chunks import get_files, put_files

    args = dict(lr=1e-3, minibatches=2, seed=0, precision="bf16-mixed",
                deepspeed={"zero_stage": 3, "param_persistence_threshold": 0})
    ranks, call = _deepspeed_ranks(ray_local, h64_path, 2, **args)
    _train_steps(call, h64_groups, 1)
    for rank_files in ray_local.get([t.save_files.remote() for t in ranks]):
        get_files(rank_files, tmp_path)
    later = _train_steps(call, copy.deepcopy(h64_groups), 1)
    expected = ray_local.get([t.state_dict.remote() for t in ranks])[0]  # every ZeRO-3 rank gathers
    for t in ranks:
        ray_local.kill(t)

    resumed, call2 = _deepspeed_ranks(ray_local, h64_path, 2, **args)
    assert ray_local.get([t.load_files.remote(put_files(tmp_path)) for t in resumed]) == [1, 1]
    assert _train_steps(call2, copy.deepcopy(h64_groups), 1) == later
    weights = ray_local.get([t.state_dict.remote() for t in resumed])[0]
    for name, value in expected.items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=0, msg=name)
    for t in resumed:
        ray_local.kill(t)


@needs_deepspeed
def test_deepspeed_refuses_lora(h64_path):
    """``models[].lora`` is the torch trainer's: the deepspeed backend refuses it (the config
    check says the same before any actor starts, ``tests/test_lora.py``)."""
    with pytest.raises(ValueError, match="deepspeed trainer backend does not train LoRA"):
        trainer_class("deepspeed")(h64_path, lora={"r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": None})


@needs_deepspeed
@pytest.mark.parametrize("zero_stage,precision,sync_dtype,element_bytes",
                         [(2, "fp32", "float32", 4), (3, "fp32", "float32", 4), (3, "bf16-mixed", "bfloat16", 2)])
def test_only_deepspeed_rank_0_copies_the_full_weights_to_the_host_for_a_sync(ray_local, h64_path, zero_stage,
                                                                              precision, sync_dtype, element_bytes):
    """A weight sync needs rank 0's full weights only; every rank takes part in ZeRO-3's gather,
    but a rank other than 0 copies nothing to the host (on a GPU node, 8 ranks of a 3 B model
    each copying its fp32 weights would hold 96 GB of host memory per sync). A bf16 sync (a vLLM
    replica of a bf16-mixed trainer) copies 2 bytes a parameter: cast on the device, not an fp32
    copy cast on the host (12 GB, not 6, for 3 B). Bytes counted by
    ``tests/strict_devices.HostTracking`` (the model's parameters count as device tensors)."""
    from tests.strict_devices import strict_trainer

    cls = ray_local.remote(strict_trainer(trainer_class("deepspeed")))
    partitioned = {"param_persistence_threshold": 0} if zero_stage == 3 else {}
    ranks = [cls.options(num_cpus=0.5).remote(str(h64_path), rank=r, world_size=2, precision=precision,
                                              sync_dtype=sync_dtype,
                                              deepspeed={"zero_stage": zero_stage, **partitioned},
                                              lr=1e-3, minibatches=1, seed=0)
             for r in range(2)]
    join_process_group(ranks)
    copied = ray_local.get([t.host_bytes.remote("weights_for_sync") for t in ranks], timeout=600)
    state = TorchTrainer(h64_path, lr=1e-3, seed=0).model.state_dict()
    # one copy per storage: the tied LM head is its embedding (the twenty-fourth read: it was copied twice)
    full = sum(v.numel() * element_bytes for v in {v.data_ptr(): v for v in state.values()}.values())
    assert copied == [full, 0]
    for t in ranks:
        ray_local.kill(t)


@needs_deepspeed
@pytest.mark.parametrize("zero_stage", [2, 3])
def test_deepspeed_ranks_hand_only_device_tensors_to_their_collectives(ray_local, h64_path, h64_groups, zero_stage):
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
             for g in with_source_side(reference, h64_groups[2:])]  # the model's own groups, offered as a peer's
    problem = generate_problems(["add"], 1, seed=5, split="train")[0]
    batch = prepared(reference.score, batch_of(h64_groups[:2], peers=peers, sgt=[(problem.prompt, problem.solution)]))
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
def test_deepspeed_gradient_checkpointing_keeps_the_losses_and_gradient_norms(ray_local, h64_path, h64_groups,
                                                                             zero_stage):
    """``models[].trainer.gradient_checkpointing`` under a ZeRO-2 engine, and ZeRO-3 over two ranks
    with every weight partitioned (gathered again in the backward's recomputation), as the GPU
    template runs it: the layers are checkpointed in the engine's module, and two steps' losses and
    gradient norms are the torch backend's without it."""
    from workers.training.checkpointing import checkpointing_on

    args = dict(lr=1e-3, minibatches=2, seed=0)
    same_path = dict(logprob_chunk_tokens=None, share_prompts=False) if zero_stage == 3 else {}
    reference = TorchTrainer(h64_path, **args, **same_path)
    expected = _train_steps(lambda m, *a: getattr(reference, m)(*a), h64_groups, 2)
    # stage 3 as the template: a token budget of a row or two a forward, so a rank often has no
    # row of a micro-batch and runs a zero-weight one (the update does not depend on the split)
    partitioned = {"deepspeed": {"zero_stage": 3, "param_persistence_threshold": 0},
                   "max_tokens_per_micro_batch": 40} if zero_stage == 3 else {}
    ranks, call = _deepspeed_ranks(ray_local, h64_path, 1 if zero_stage == 2 else 2,
                                   gradient_checkpointing=True, **partitioned, **args)
    assert ray_local.get(ranks[0].__ray_call__.remote(lambda self: checkpointing_on(self.engine.module)))
    np.testing.assert_allclose(_train_steps(call, h64_groups, 2), expected, rtol=1e-4, atol=1e-6)
    for t in ranks:
        ray_local.kill(t)


@needs_deepspeed
@pytest.mark.parametrize("zero_stage", [2, 3])
def test_deepspeed_bf16_exports_bf16_files_of_its_weights(ray_local, h64_path, h64_groups, zero_stage, tmp_path):
    """``trainer.export_dtype`` auto under the engine's bf16 (``precision: bf16-mixed``): the
    export's tensors are bf16, the engine module's weights, under ZeRO-3 gathered from two ranks'
    partitions; ``config.json`` says bfloat16; the files are half the tensor bytes of a
    ``float32`` export, which holds the optimizer's fp32 masters: finer than bf16, and rounding
    to the module's weights (DeepSpeed casts the masters to bf16 after each step)."""
    from safetensors.torch import load_file

    from tests.test_export_dtype import data_bytes, written

    partitioned = {"param_persistence_threshold": 0} if zero_stage == 3 else {}
    ranks, call = _deepspeed_ranks(ray_local, h64_path, 1 if zero_stage == 2 else 2, precision="bf16-mixed",
                                   deepspeed={"zero_stage": zero_stage, **partitioned}, lr=1e-3, minibatches=1,
                                   seed=0)
    _train_steps(call, h64_groups, 1)
    module = ray_local.get([t.state_dict.remote() for t in ranks])[0]  # the module's weights, as fp32
    ray_local.get([t.export.remote(str(tmp_path / "bf16")) for t in ranks])
    tensors, dtype = written(tmp_path / "bf16")
    assert dtype == "bfloat16" and {v.dtype for v in tensors.values()} == {torch.bfloat16}
    # the model ties its LM head to its embedding: written once, as the torch trainer writes it
    # (the twenty-fourth read: the gathered copies were one per name, the head's written twice)
    assert "model.embed_tokens.weight" in tensors and "lm_head.weight" not in tensors, sorted(tensors)
    assert ray_local.get([t.__ray_call__.remote(_tied_sync_is_one_tensor) for t in ranks])[0]  # sent once
    for name, value in tensors.items():
        assert torch.equal(value, module[name].to(torch.bfloat16)), name
    ray_local.get([t.__ray_call__.remote(_export_float32, str(tmp_path / "fp32")) for t in ranks])
    tensors32 = load_file(str(tmp_path / "fp32" / "model.safetensors"))
    assert tensors32.keys() == tensors.keys()  # the masters' export: the tied head once too
    assert written(tmp_path / "fp32")[1] == "float32" and {v.dtype for v in tensors32.values()} == {torch.float32}
    assert 2 * data_bytes(tmp_path / "bf16") == data_bytes(tmp_path / "fp32")
    for name, value in tensors32.items():
        assert torch.equal(value.to(torch.bfloat16), tensors[name]), name
    assert any(not torch.equal(value.to(torch.bfloat16).float(), value) for value in tensors32.values())
    for t in ranks:
        ray_local.kill(t)


def _tied_sync_is_one_tensor(trainer) -> bool | None:
    """Rank 0: whether a weight sync's tied head and embedding are one host tensor (others: None;
    every rank calls it: ZeRO-3 gathers)."""
    weights = trainer.weights_for_sync()
    return None if weights is None else weights["lm_head.weight"] is weights["model.embed_tokens.weight"]


def _export_float32(trainer, folder: str) -> str:
    """``export`` of a rank with ``export_dtype: float32`` (every rank calls it: ZeRO-3 gathers)."""
    trainer.settings = trainer.settings.with_changes(export_dtype="float32")
    return trainer.export(folder)


@needs_deepspeed
def test_zero3_ranks_all_run_the_forward_of_a_row_that_is_one_ranks_share(ray_local, h64_path, h64_groups):
    """Under ZeRO-3 a forward gathers the partitioned weights collectively, so a scoring pass must
    run the same forwards on every rank (``DeepSpeedTrainer._score_share``). One row on two ranks
    is rank 0's share alone; rank 1, scoring only its (empty) share, would run no forward and leave
    rank 0 waiting in its first gather. The answers are rank 0's row and nothing from rank 1, the
    torch backend's log-probs."""
    own = batch_of(h64_groups[:1])
    one_row = own.select([0])
    reference = TorchTrainer(h64_path, lr=1e-3, seed=0, logprob_chunk_tokens=None, share_prompts=False)
    expected = reference.score(one_row)["old_logp"]
    ranks, _ = _deepspeed_ranks(ray_local, h64_path, 2, lr=1e-3, seed=0,
                                deepspeed={"zero_stage": 3, "param_persistence_threshold": 0})
    # a hang guard, not a timing: a rank left alone in a gather waits there for ever
    answers = ray_local.get([t.score.remote(one_row) for t in ranks], timeout=300)
    assert [len(a["old_logp"]) for a in answers] == [1, 0]
    np.testing.assert_allclose(concat_shares(answers)["old_logp"][0], expected[0], rtol=1e-4, atol=1e-5)
    for t in ranks:
        ray_local.kill(t)


@needs_deepspeed
def test_zero3_ranks_score_a_peer_row_past_the_token_budget_as_nan_in_the_same_forwards(ray_local, h64_path,
                                                                                        h64_groups):
    """``score_peers`` under ZeRO-3 with a token budget: the row past it answers NaN, after a
    one-token forward that every rank runs (no rank is left in a gather), and the row within it is
    the torch backend's. Each of the two ranks answers its own row."""
    group = h64_groups[0]
    short = group.responses[0]
    rows = StepRecord({"prompt": [group.prompt] * 2, "response": [short, short * 40], "finished": [True, True]})
    reference = TorchTrainer(h64_path, lr=1e-3, seed=0, logprob_chunk_tokens=None, share_prompts=False)
    expected = reference.score_peers(rows.select([0]))["logp"][0]
    budget = len(reference._prompt_ids(group.prompt)) + len(expected) + 2
    ranks, _ = _deepspeed_ranks(ray_local, h64_path, 2, lr=1e-3, seed=0, max_tokens_per_micro_batch=budget,
                                deepspeed={"zero_stage": 3, "param_persistence_threshold": 0})
    # a hang guard, not a timing: a rank left alone in a gather waits there for ever
    answers = concat_shares(ray_local.get([t.score_peers.remote(rows) for t in ranks], timeout=300))
    np.testing.assert_allclose(answers["logp"][0], expected, rtol=1e-4, atol=1e-5)
    assert len(answers["logp"][1]) > budget and np.all(np.isnan(answers["logp"][1])) and np.isnan(answers["mean"][1])
    for t in ranks:
        ray_local.kill(t)
