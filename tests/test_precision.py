"""Precision as a model setting (``models[].trainer.precision``, ``models[].generation.dtype``;
``workers/precision.py``), on the demo pair's real tiny models: bf16-mixed computes the fp32
loss and gradients to within bf16's rounding, with fp32 master weights and AdamW state; its
log-probs are fp32 (the logits are cast before the log-softmax); weight sync sends the
replicas' dtype; a bf16-mixed pair run obeys Eq. 4 and the gate; a bf16-mixed resume ends where
the uninterrupted run ends, bit for bit.

The tolerance of the loss and gradient comparison, derived. bf16 keeps 8 significant bits
(7 stored + the implicit one), so one rounding to bf16 changes a value by a relative
u = 2^-8 ~ 3.9e-3 at most. Under autocast the weights stay fp32 and only what a matmul reads and
writes is rounded (the residual stream, the norms, the softmax of the loss stay fp32): counting
the roundings in series along a token's path, a decoder layer has at most 10 (its input to the
q/k/v projections, their outputs, the attention's output, the output projection's output, the
MLP's input, its first linear's output, the activation, the gate product, the down
projection's output), the head 2 (its input and its logits), so the forward has
K_f = 10 L + 2 roundings in series (L = 2 here: 22), and the backward as many again (each
backward matmul reads the incoming gradient rounded to bf16 and writes a rounded result),
K_b = K_f. To first order relative errors along a chain add, (1 + u)^K - 1 ~ K u, so in the
worst case (every rounding the same way) the gradient's relative error is at most
(K_f + K_b) u = 44 * 2^-8 ~ 0.17; independent roundings add in quadrature instead,
sqrt(K_f + K_b) u ~ 0.026. We assert the worst case, ||g_bf16 - g_fp32|| / ||g_fp32|| <=
(K_f + K_b) u (measured: 0.041 for llama-char, 0.029 for gpt2-bpe, between the two estimates:
the layers amplify some errors). The loss is Eq. 10's token mean with pi_old = the fp32
log-probs, so with per-token log-prob differences d_t = logp_bf16 - logp_fp32 (no token is
clipped while |d_t| < log(1.2)) it differs from the fp32 loss by exactly
-(1/N) sum_t A_t (exp(d_t) - 1): we assert |dL| <= (1/N) sum_t |A_t| |exp(d_t) - 1| + 1e-6, i.e.
that the loss's fp32 reduction adds nothing to what its log-probs carry. The log-probs
themselves must equal the fp64 log-softmax of the head's bf16 logits to fp32 accuracy (1e-5;
a logsumexp in bf16 would be off by up to half a bf16 ulp of |lse| ~ 1e-2)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from graftpool.step_record import StepRecord
from orchestrator.config import ConfigError, load_config
from orchestrator.controller.loop import train
from tests.platform_checks import check_store, read_store
from tests.run_copy import cut_back
from workers.precision import (
    deepspeed_bf16,
    precision_for,
    resolve_generation_dtype,
    resolve_precision,
)
from workers.receiver.objective import RowConstants, TokenObjective
from workers.receiver.retokenize import token_rows
from workers.rollout.generation import HFGeneration, SamplingParams
from workers.training.trainer import TorchTrainer

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "configs" / "demo_pair.yaml"
U = 2.0**-8  # bf16's unit roundoff (8 significant bits)
BF16 = ["models.0.trainer.precision=bf16-mixed", "models.1.trainer.precision=bf16-mixed"]
RUN = ["run.steps=2", "algorithm.prompt_batch=16", "run.eval_every=0", "data.eval=[]", "run.checkpoint_every=1"]


def _rows(trainer: TorchTrainer, groups) -> tuple[StepRecord, torch.Tensor]:
    rows = token_rows([trainer._prompt_ids(g.prompt) for g in groups for _ in g.token_ids],
                      [list(ids) for g in groups for ids in g.token_ids])
    # fixed advantages of both signs (the rollouts' own GRPO advantages are zero on uniform groups)
    advantages = torch.randn(len(rows), generator=torch.Generator().manual_seed(0))
    return rows, advantages


def test_auto_resolves_by_device_and_deepspeed_maps_or_refuses():
    assert resolve_precision("auto", "cpu") == "fp32" and resolve_precision("auto", "cuda") == "bf16-mixed"
    assert resolve_generation_dtype("auto", "cpu") == "float32"
    assert resolve_generation_dtype("auto", "cuda") == "bfloat16"
    mixed = precision_for("bf16-mixed", "cpu")
    assert mixed.weights == torch.float32 and mixed.compute == torch.bfloat16
    assert precision_for("bf16", "cpu").weights == torch.bfloat16
    assert deepspeed_bf16("bf16-mixed", None) is True and deepspeed_bf16("fp32", None) is False
    assert deepspeed_bf16("auto", None) is None
    with pytest.raises(ValueError, match="fp32 master weights"):
        deepspeed_bf16("bf16", None)
    with pytest.raises(ConfigError, match="contradicts deepspeed.bf16"):
        load_config(DEMO, ["models.0.trainer.backend=deepspeed", "models.0.trainer.precision=fp32",
                           "models.0.trainer.deepspeed.bf16=true"], check_backends=False)
    with pytest.raises(ConfigError, match="fp32 master weights"):
        load_config(DEMO, ["models.0.trainer.backend=deepspeed", "models.0.trainer.precision=bf16"],
                    check_backends=False)
    with pytest.raises(ConfigError, match="vllm.dtype"):
        load_config(DEMO, ["models.0.generation.backend=vllm", "models.0.generation.dtype=bfloat16"],
                    check_backends=False)
    with pytest.raises(ConfigError, match="precision"):
        load_config(DEMO, ["models.0.trainer.precision=fp16"])


@pytest.mark.parametrize("name", ["llama-char", "gpt2-bpe"])
def test_bf16_mixed_loss_and_gradients_match_fp32_within_rounding(paths, rollouts, name):
    """Loss and gradients of Eq. 10 on the model's own rollouts, fp32 vs bf16-mixed, within the
    tolerance derived in the module docstring; fp32 master weights, gradients and AdamW state: one
    AdamW step at the paper's lr 1e-6 moves every weight with a gradient, by ~lr, which bf16
    weights could not hold (half a bf16 ulp of a weight of size 0.02 is 3e-5)."""
    _, groups = rollouts
    out = {}
    for precision in ("fp32", "bf16-mixed"):
        trainer = TorchTrainer(paths[name], precision=precision, lr=1e-6, seed=0)
        rows, advantages = _rows(trainer, groups[name])
        logp, mask = trainer._logprobs(rows)
        assert logp.dtype == torch.float32
        out[precision] = trainer, rows, advantages, logp, mask
    trainer32, rows, advantages, logp32, mask = out["fp32"]
    old = logp32.detach()  # pi_old: the fp32 log-probs, so the fp32 ratios are 1
    objective, tokens = TokenObjective(0.2, 0.28), float(mask.sum())
    constants = RowConstants(advantages, torch.ones(len(rows)), torch.zeros(len(rows), dtype=torch.bool),
                             torch.full((len(rows),), float("nan")))
    losses, grads = {}, {}
    for precision, (trainer, _, _, logp, _) in out.items():
        trainer.optimizer.zero_grad()
        loss = objective(logp, old, mask, constants, 0, tokens).loss
        trainer._backward(loss)
        losses[precision] = float(loss.detach())
        grads[precision] = torch.cat([p.grad.flatten() for p in trainer.model.parameters()])
    trainer16, _, _, logp16, _ = out["bf16-mixed"]
    d = (logp16 - logp32).detach()[mask.bool()]
    assert d.abs().max() < math.log(1.2), "no token is clipped: the loss difference below is exact"
    a = advantages[:, None].expand_as(mask)[mask.bool()]
    loss_tol = float((a.abs() * (d.exp() - 1).abs()).sum() / tokens) + 1e-6
    assert abs(losses["bf16-mixed"] - losses["fp32"]) <= loss_tol, (losses, loss_tol)
    layers = trainer32.model.config.num_hidden_layers
    k_forward = 10 * layers + 2
    grad_tol = 2 * k_forward * U
    rel = float((grads["bf16-mixed"] - grads["fp32"]).norm() / grads["fp32"].norm())
    assert grads["fp32"].norm() > 0 and rel <= grad_tol, (rel, grad_tol)
    print(f"{name}: per-token |d| max {float(d.abs().max()):.3g} rms {float(d.pow(2).mean().sqrt()):.3g}; "
          f"loss diff {abs(losses['bf16-mixed'] - losses['fp32']):.2e} <= {loss_tol:.2e}; "
          f"gradient rel. error {rel:.3f} <= {grad_tol:.3f}")

    # fp32 master weights, gradients and AdamW state; a 1e-6 step is kept
    before = {k: v.detach().clone() for k, v in trainer16.model.named_parameters()}
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in trainer16.model.parameters())
    trainer16._optimizer_step()
    for state in trainer16.optimizer.state.values():
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    moved = kept = 0
    for key, param in trainer16.model.named_parameters():
        has_grad = param.grad.abs() > 1e-6  # Adam's step is ~lr here (eps 1e-8), not a rounding away
        step = (param.detach() - before[key]).abs()
        moved += int((step[has_grad] > 0).sum())
        kept += int(has_grad.sum())
        assert float(step.max()) < 3e-6, key  # AdamW's first step: lr (1 + weight decay), and no more
    assert moved == kept > 0, f"{kept - moved} of {kept} weights with a gradient did not move"


def test_bf16_mixed_logprobs_are_the_fp32_log_softmax_of_the_bf16_logits(paths, rollouts):
    """Under bf16-mixed the head's logits are bf16; the log-probs the trainer returns are fp32
    and equal, to fp32 accuracy, the fp64 log-softmax of exactly those logits (chunked head,
    prompts shared: the trainer's default path)."""
    _, groups = rollouts
    trainer = TorchTrainer(paths["llama-char"], precision="bf16-mixed", logprob_chunk_tokens=64)
    rows, _ = _rows(trainer, groups["llama-char"])
    captured = []
    hook = trainer.model.get_output_embeddings().register_forward_hook(lambda m, i, o: captured.append(o))
    with torch.no_grad():
        logp, mask = trainer._logprobs(rows)
    hook.remove()
    assert logp.dtype == torch.float32 and len(captured) > 1 and {z.dtype for z in captured} == {torch.bfloat16}
    z = torch.cat(captured).double()
    where = mask.bool()
    targets = torch.tensor([t for r in rows["response_ids"] for t in r])
    assert z.shape[0] == int(where.sum()) == len(targets)
    expected = z.gather(1, targets[:, None])[:, 0] - torch.logsumexp(z, dim=-1)
    got = logp[where].double()
    assert float((got - expected).abs().max()) < 1e-5


def test_weight_sync_sends_the_generation_dtype(paths):
    """The trainer casts what it sends (object store and collective alike) to the replicas'
    dtype, on the device before the copy to the host (2 bytes a parameter, not an fp32 copy of
    4: bytes counted by ``tests/strict_devices.HostTracking``); an hf replica in bfloat16 holds
    exactly those weights and samples fp32 log-probs."""
    from tests.strict_devices import HostTracking

    trainer = TorchTrainer(paths["gpt2-bpe"], precision="bf16-mixed", sync_dtype="bfloat16")
    with HostTracking() as copies:
        sent = trainer.weights_for_sync()
    # one host copy per storage: gpt2's LM head is its token embedding (tied), sent as one tensor
    assert sent["lm_head.weight"] is sent["transformer.wte.weight"]
    unique = {id(v): v for v in sent.values()}.values()
    assert copies.to_host_bytes == sum(v.numel() * v.element_size() for v in unique)
    assert copies.to_host_bytes < sum(v.numel() * 4 for v in unique)
    masters = trainer.state_dict()
    assert {v.dtype for v in masters.values() if v.is_floating_point()} == {torch.float32}
    assert {v.dtype for v in sent.values() if v.is_floating_point()} == {torch.bfloat16}
    assert {v.dtype for v in trainer._sync_source().values() if v.is_floating_point()} == {torch.bfloat16}
    replica = HFGeneration(paths["gpt2-bpe"], dtype="bfloat16")
    assert {p.dtype for p in replica.model.parameters()} == {torch.bfloat16}
    replica.load_weights(sent, 1)
    for key, value in replica.model.state_dict().items():
        assert torch.equal(value, masters[key].to(value.dtype)), key
    torch.manual_seed(0)
    completion = replica.generate(["12+35="], SamplingParams(n=2, max_new_tokens=8))[0]
    assert all(isinstance(x, float) for lps in completion.logprobs for x in lps)


# -- end to end -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory, ray_local):
    out = tmp_path_factory.mktemp("bf16")
    config = load_config(DEMO, [*RUN, *BF16, "models.1.generation.dtype=bfloat16", f"run.output_dir={out}",
                                "run.name=mixed"])
    return train(config), config, out


@pytest.mark.slow
def test_bf16_mixed_pair_run_obeys_eq4_and_the_gate(bf16_run):
    """The demo pair trained in bf16-mixed (gpt2-bpe's replica sampling in bfloat16) for 2 steps:
    the store passes the Eq. 4 / Eq. 8 checks, with grafts, the checkpoints hold fp32
    masters and the final models are bf16 (``trainer.export_dtype`` auto)."""
    summary, config, out = bf16_run
    assert [m.trainer.precision for m in config.models] == ["bf16-mixed", "bf16-mixed"]
    rows = read_store(out / "mixed")
    grafted = check_store(rows, config.algorithm.n, config.exchange.delta, 2, 16, [m.name for m in config.models])
    assert grafted > 0 and summary["steps"] == 2
    for model in config.models:
        saved = torch.load(out / "mixed" / "checkpoints" / "step_000002" / model.name / "trainer_rank0.pt",
                           weights_only=False)
        assert {v.dtype for v in saved["model"].values() if v.is_floating_point()} == {torch.float32}
        final = load_file(str(out / "mixed" / "final" / model.name / "model.safetensors"))
        assert {v.dtype for v in final.values()} == {torch.bfloat16}


@pytest.mark.slow
def test_bf16_mixed_resume_equals_the_uninterrupted_run(bf16_run):
    """The run folder as it was when the uninterrupted run had written its step-1 checkpoint (a
    copy, cut back to step 1: checkpoint step 2, the step-2 store file, summary and final models
    gone), resumed (``run.resume``), ends where the uninterrupted run ends: every store row and
    the final weights, bit for bit."""
    _, config, out = bf16_run
    copy = out / "copy"
    cut = cut_back(out, "mixed", 1, copy)
    train(load_config(DEMO, [*RUN, *BF16, "models.1.generation.dtype=bfloat16", f"run.output_dir={copy}",
                             "run.name=mixed", "run.resume=true"]))
    key = ("step", "model", "prompt_id", "source_model", "sample")
    rows = {tuple(r[k] for k in key): r for r in read_store(cut)}
    ref = {tuple(r[k] for k in key): r for r in read_store(out / "mixed")}
    assert rows.keys() == ref.keys() and len(rows) > 0
    for k, row in rows.items():
        assert row == ref[k], k
    for model in config.models:
        assert (cut / "final" / model.name / "model.safetensors").read_bytes() == \
            (out / "mixed" / "final" / model.name / "model.safetensors").read_bytes()
    shutil.rmtree(copy, ignore_errors=True)
