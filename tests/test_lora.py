"""LoRA per model (``models[].lora``, ``workers/lora.py``), on the demo pair's real tiny
models.

Unit level: the config's checks name the field; the trainer's adapted model gives the loss and
gradients of a reference peft model built here independently (``peft.get_peft_model`` on a
fresh transformers model, the same seed), scores peer responses with its adapted weights, and
its AdamW covers the adapters only; a weight sync carries the adapter weights only, which an
``hf`` replica copies into its own adapters in place (its base tensors untouched); the export
is the merged model, which answers what the adapted model answers.

End to end: the demo pair with LoRA on llama-char, 2 steps: the store obeys Eq. 4 and the gate,
the receiver's s of a grafted response is its adapted weights' (recomputed here from the
checkpoint's adapters), checkpoints hold adapters and their optimizer state only, the final
folder is what ``graftpool serve`` serves; stopped after step 1 and resumed, the run ends where
the uninterrupted one ends, bit for bit.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from graftpool.step_record import StepRecord
from orchestrator.config import ConfigError, load_config
from orchestrator.controller.loop import train
from orchestrator.models import resolve_model_path
from tests.platform_checks import check_store, read_store
from tests.reference import (
    RefRow,
    mean_logp,
    peer_tokens,
    prompt_tokens,
    token_logprobs,
    update_loss,
)
from tests.run_copy import cut_back
from tests.tiny_pair import batch_of
from workers.lora import ADAPTER_FOLDER, check_targets
from workers.receiver.objective import RowConstants, TokenObjective
from workers.receiver.retokenize import token_rows
from workers.rollout.generation import HFGeneration, SamplingParams
from workers.rollout.weight_sync import make_plan
from workers.training.trainer import TorchTrainer

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "configs" / "demo_pair.yaml"
INIT_SEED = 123
LORA = {"r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": None, "init_seed": INIT_SEED}
TARGETS = {"llama-char": ("q_proj", "v_proj"), "gpt2-bpe": ("c_attn",)}  # peft's defaults


def _reference(path: Path, lora: dict = LORA):
    """A peft model built here from the folder, as a user would: the same seed before
    ``get_peft_model``, the same rank, alpha and (default) target modules."""
    base = AutoModelForCausalLM.from_pretrained(str(path))
    torch.manual_seed(lora["init_seed"])
    return get_peft_model(base, LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                                           target_modules=lora["target_modules"]))


def _adapters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """The adapter parameters by their name in the transformers model (peft's prefix dropped)."""
    return {name.removeprefix("base_model.model."): p for name, p in model.named_parameters() if p.requires_grad}


def _move_b(trainer: TorchTrainer, reference) -> None:
    """The same seeded non-zero B in both (B starts at zero: A would get no gradient)."""
    gen = torch.Generator().manual_seed(7)
    ref = _adapters(reference)
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.05 * torch.randn(param.shape, generator=gen))
                ref[name].copy_(param)


def test_config_checks_name_the_lora_field(paths):
    config = load_config(DEMO, ["models.0.lora={r: 4, alpha: 8, target_modules: q_proj}"])
    assert config.models[0].lora.target_modules == ["q_proj"] and config.models[1].lora is None
    for override, field in [("{r: 0}", "models.0.lora.r"), ("{alpha: 0}", "models.0.lora.alpha"),
                            ("{dropout: 1.0}", "models.0.lora.dropout"), ("{target_modules: []}",
                                                                          "models.0.lora.target_modules"),
                            ("{rank: 8}", "models.0.lora.rank: unknown key")]:
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            load_config(DEMO, [f"models.0.lora={override}"])
    with pytest.raises(ConfigError, match="lora: the deepspeed trainer backend does not train LoRA"):
        load_config(DEMO, ["models.0.lora={}", "models.0.trainer.backend=deepspeed"], check_backends=False)
    check_targets(paths["gpt2-bpe"], {**LORA, "target_modules": "all-linear"})
    with pytest.raises(ValueError, match=r"lora.target_modules \['up_proj'\]: Target modules \{'up_proj'\} not found"):
        check_targets(paths["gpt2-bpe"], {**LORA, "target_modules": ["up_proj"]})


def test_a_missing_target_module_fails_the_run_before_any_actor(tmp_path):
    config = load_config(DEMO, ["models.1.lora={target_modules: [q_proj]}", f"run.output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"models\.gpt2-bpe\.lora\.target_modules \['q_proj'\]"):
        train(config)


@pytest.mark.parametrize("name", ["llama-char", "gpt2-bpe"])
def test_adapted_loss_and_gradients_equal_a_reference_peft_model(paths, rollouts, name):
    """Eq. 10's loss and its gradient on the model's own rollouts: the trainer's (prompts shared,
    chunked LM head) and the reference peft model's (plain forwards one row at a time,
    ``tests/reference.py``); the same adapter init; gradients on the adapters only, AdamW over
    them only, the base never moves; peer responses are scored with the adapted weights."""
    _, groups = rollouts
    trainer = TorchTrainer(paths[name], lora=LORA, lr=1e-3, seed=0)
    reference = _reference(paths[name])
    ref = _adapters(reference)
    assert list(ref) == trainer.adapters.names and len(ref) == 4 * len(TARGETS[name])
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in ref} == set(TARGETS[name])
    state = trainer.model.state_dict()
    assert all(torch.equal(state[n], p) for n, p in ref.items()), "the same adapter init"
    _move_b(trainer, reference)

    rows = token_rows([trainer._prompt_ids(g.prompt) for g in groups[name] for _ in g.token_ids],
                      [list(ids) for g in groups[name] for ids in g.token_ids])
    advantages = torch.randn(len(rows), generator=torch.Generator().manual_seed(0))
    logp, mask = trainer._logprobs(rows)
    constants = RowConstants(advantages, torch.ones(len(rows)), torch.zeros(len(rows), dtype=torch.bool),
                             torch.full((len(rows),), float("nan")))
    loss = TokenObjective(0.2, 0.28)(logp, logp.detach(), mask, constants, 0, float(mask.sum())).loss
    trainer.optimizer.zero_grad()
    trainer._backward(loss)

    reference.train()
    with torch.no_grad():
        pairs = list(zip(rows["prompt_ids"], rows["response_ids"], strict=True))
        old = [token_logprobs(reference, p, r) for p, r in pairs]
    ref_loss = update_loss(reference, [RefRow(p, r, float(a), 1.0, o)
                                       for (p, r), a, o in zip(pairs, advantages, old, strict=True)])
    ref_loss.backward()
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5, abs=1e-7)
    grads = dict(trainer.model.named_parameters())
    for n, p in ref.items():
        assert p.grad.norm() > 0, n
        torch.testing.assert_close(grads[n].grad, p.grad, rtol=1e-4, atol=1e-6, msg=n)
    assert all(p.grad is None and not p.requires_grad for n, p in grads.items() if n not in ref), \
        "the base gets no gradient"

    base = {n: p.detach().clone() for n, p in grads.items() if n not in ref}
    trainer._optimizer_step()
    assert [p for group in trainer.optimizer.param_groups for p in group["params"]] == trainer.params
    assert [id(p) for p in trainer.params] == [id(grads[n]) for n in trainer.adapters.names]
    assert len(trainer.optimizer.state) == len(ref), "AdamW state for the adapters only"
    assert all(torch.equal(grads[n], b) for n, b in base.items()), "the base never moves"

    # the gate: a peer response is scored under the receiver's adapted weights
    peer = groups["gpt2-bpe" if name == "llama-char" else "llama-char"][:3]
    prompts = [g.prompt for g in peer for _ in g.responses]
    texts = [t for g in peer for t in g.responses]
    done = [f for g in peer for f in g.finished]
    got = trainer.score_peers(StepRecord({"prompt": prompts, "response": texts, "finished": done}))["mean"]
    tokenizer = AutoTokenizer.from_pretrained(str(paths[name]))
    adapted = _reference(paths[name])
    adapted.load_state_dict({f"base_model.model.{k}": v for k, v in trainer.state_dict().items()})
    expected = [mean_logp(adapted, prompt_tokens(tokenizer, p), peer_tokens(tokenizer, t, f))
                for p, t, f in zip(prompts, texts, done, strict=True)]
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    plain = AutoModelForCausalLM.from_pretrained(str(paths[name]))
    base_scores = [mean_logp(plain, prompt_tokens(tokenizer, p), peer_tokens(tokenizer, t, f))
                   for p, t, f in zip(prompts, texts, done, strict=True)]
    assert not np.allclose(got, base_scores, rtol=1e-5), "the adapters change the scores"


def test_weight_sync_sends_the_adapters_and_replicas_apply_them_in_place(paths, rollouts):
    """After an update: the object-store sync (``weights_for_sync``) and the collective one
    (``_sync_source`` and its plan) carry the adapter weights only, in fp32 even where the replicas
    run in bf16; an hf replica with the same lora copies them into its adapters, in place (the base
    tensors are the same objects, unchanged), and then holds the trainer's adapted model."""
    _, groups = rollouts
    path = paths["llama-char"]
    trainer = TorchTrainer(path, lora=LORA, lr=1e-2, minibatches=1, seed=0)
    replica = HFGeneration(path, lora=LORA)
    assert all(torch.equal(v, trainer.state_dict()[k]) for k, v in replica.model.state_dict().items()), \
        "the replica starts with the trainer's adapters"
    own = [dataclasses.replace(g, advantages=np.array([1.0, -1.0, 0.5, -0.5])) for g in groups["llama-char"][:4]]
    trainer.train(batch_of(own=own))

    sent = trainer.weights_for_sync()
    full = trainer.state_dict()
    assert list(sent) == trainer.adapters.names and all(v.dtype == torch.float32 for v in sent.values())
    assert list(trainer._sync_source()) == trainer.adapters.names
    plan = make_plan(trainer._sync_source())
    adapter_bytes = sum(v.numel() * v.element_size() for v in sent.values())
    full_bytes = sum(v.numel() * v.element_size() for v in full.values())
    assert plan.nbytes == adapter_bytes < full_bytes / 10
    print(f"llama-char: {adapter_bytes} adapter bytes per sync against {full_bytes} for the full model")

    base_before = {k: (v, v.clone()) for k, v in replica.model.state_dict().items() if ".lora_" not in k}
    replica.load_weights(sent, 1)
    after = replica.model.state_dict()
    for k, v in full.items():
        assert torch.equal(after[k], v), k
    for k, (tensor, value) in base_before.items():
        assert after[k].data_ptr() == tensor.data_ptr() and torch.equal(after[k], value), k

    stream = HFGeneration(path, lora=LORA)  # the collective path: a stream of (name, tensor)
    stream.load_weight_stream(iter(sent.items()), 1)
    assert all(torch.equal(stream.model.state_dict()[k], v) for k, v in full.items())
    with pytest.raises(RuntimeError, match="did not come"):
        stream.load_weight_stream(iter(list(sent.items())[:-1]), 2)
    with pytest.raises(RuntimeError, match="not an adapter weight"):
        stream.load_weights({"model.norm.weight": full["model.norm.weight"]}, 2)

    # a bf16 replica: bf16 base, fp32 adapters (peft's), which hold the sent adapters exactly
    mixed = TorchTrainer(path, lora=LORA, precision="bf16-mixed", sync_dtype="bfloat16")
    half = HFGeneration(path, lora=LORA, dtype="bfloat16")
    half.load_weights(sent, 1)
    dtypes = {k: v.dtype for k, v in half.model.state_dict().items()}
    assert {dtypes[k] for k in trainer.adapters.names} == {torch.float32}
    assert dtypes["model.norm.weight"] == torch.bfloat16
    assert all(torch.equal(half.model.state_dict()[k], v) for k, v in sent.items())
    assert all(v.dtype == torch.float32 for v in mixed.weights_for_sync().values())
    torch.manual_seed(0)
    assert half.generate(["12+35="], SamplingParams(n=2, max_new_tokens=8))[0].responses


def test_export_is_the_merged_model_with_the_adapters_beside_it(paths, tmp_path):
    """``export``: a plain transformers folder whose logits are the adapted model's (to fp32
    rounding: W + s B A is summed once instead of per forward), and ``adapter/`` in peft's format,
    which ``PeftModel.from_pretrained`` puts back on the base model exactly."""
    path = paths["gpt2-bpe"]
    trainer = TorchTrainer(path, lora=LORA, seed=0)
    _move_b(trainer, _reference(path))
    trainer.export(tmp_path / "final")
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "final"))
    assert not any(".lora_" in k or "base_layer" in k for k in merged.state_dict())
    restored = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(path)),
                                         str(tmp_path / "final" / ADAPTER_FOLDER))
    ids = torch.tensor([trainer.tokenizer("12+35=")["input_ids"]])
    trainer.model.eval()
    with torch.no_grad():
        adapted, plain, again = (m(input_ids=ids).logits for m in (trainer.model, merged, restored))
    assert torch.equal(again, adapted)
    torch.testing.assert_close(plain, adapted, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(plain, AutoModelForCausalLM.from_pretrained(str(path))(input_ids=ids).logits)


# -- end to end -----------------------------------------------------------------------------

RUN = ["run.steps=2", "algorithm.prompt_batch=16", "run.eval_every=0", "data.eval=[]", "run.checkpoint_every=1",
       "models.0.lora={r: 4, alpha: 8}", "models.0.trainer.lr=2e-3"]  # LoRA's usual larger lr


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, ray_local):
    out = tmp_path_factory.mktemp("lora")
    config = load_config(DEMO, [*RUN, f"run.output_dir={out}", "run.name=adapted"])
    return train(config), config, out


@pytest.mark.slow
def test_lora_pair_run_trains_the_adapters_and_keeps_the_gate(lora_run):
    """The demo pair, llama-char with LoRA: the store passes the Eq. 4 / Eq. 8 checks with grafts;
    every s of a response grafted into llama-char is its adapted weights' (step 2: the step-1
    checkpoint's adapters on the base, a reference peft model); the checkpoints hold llama-char's
    adapter weights and their AdamW state only (gpt2-bpe's: the full model); the final folder is
    the merged model (only the adapted weights differ from the base), which the server class of
    ``graftpool serve`` loads and which answers as the adapted model does."""
    summary, config, out = lora_run
    run_dir = out / "adapted"
    rows = read_store(run_dir)
    grafted = check_store(rows, config.algorithm.n, config.exchange.delta, 2, 16, [m.name for m in config.models])
    assert grafted > 0 and summary["steps"] == 2
    lora = {**config.models[0].lora.model_dump(), "init_seed": config.run.seed}

    llama = resolve_model_path(config.models[0])
    tokenizer = AutoTokenizer.from_pretrained(str(llama))
    checked, off = 0, []
    base_model = AutoModelForCausalLM.from_pretrained(str(llama))
    for step in (1, 2):
        model = _reference(llama, lora)
        if step == 2:
            saved = torch.load(run_dir / "checkpoints" / "step_000001" / "llama-char" / "trainer_rank0.pt",
                               weights_only=False)
            model.load_state_dict({f"base_model.model.{k}": v for k, v in saved["model"].items()}, strict=False)
        model.eval()
        for r in (r for r in rows if r["kind"] == "graft" and r["model"] == "llama-char" and r["step"] == step):
            plain = peer_tokens(tokenizer, r["response"], finished=False)
            o = peer_tokens(tokenizer, r["response"], finished=r["n_tokens"] == len(plain) + 1)
            q = prompt_tokens(tokenizer, r["rendered_prompt"])
            s = np.exp(mean_logp(model, q, o) - r["mean_logp"])
            assert r["compat"] == pytest.approx(s, rel=2e-4), (step, r["prompt_id"], r["sample"])
            checked += 1
            if step == 2:  # the base model's s, which the receiver must not have used
                off.append(abs(np.exp(mean_logp(base_model, q, o) - r["mean_logp"]) / r["compat"] - 1))
    assert checked > 0 and off and max(off) > 1e-2, "step 2's s tells the adapted weights from the base"

    for step in (1, 2):
        folder = run_dir / "checkpoints" / f"step_{step:06d}"
        saved = torch.load(folder / "llama-char" / "trainer_rank0.pt", weights_only=False)
        assert saved["model"] and all(".lora_" in k for k in saved["model"]), "adapter weights only"
        assert len(saved["model"]) == 4 * len(TARGETS["llama-char"])
        assert len(saved["optimizer"]["state"]) == len(saved["model"]), "AdamW state over the adapters only"
        assert any(float(v.abs().sum()) > 0 for k, v in saved["model"].items() if "lora_B" in k), "B moved"
        full = torch.load(folder / "gpt2-bpe" / "trainer_rank0.pt", weights_only=False)["model"]
        assert not any(".lora_" in k for k in full) and len(full) > len(saved["model"])

    final = run_dir / "final" / "llama-char"
    merged = AutoModelForCausalLM.from_pretrained(str(final)).state_dict()
    base = AutoModelForCausalLM.from_pretrained(str(llama)).state_dict()
    assert merged.keys() == base.keys()
    changed = {k for k in base if not torch.equal(merged[k], base[k])}
    assert changed and all(k.split(".")[-2] in TARGETS["llama-char"] for k in changed), changed
    assert (final / ADAPTER_FOLDER / "adapter_model.safetensors").is_file()

    from orchestrator.serving.serve import ModelServer, final_models

    served_path, template = final_models(run_dir)["llama-char"]
    assert served_path == final
    server = ModelServer.func_or_class("llama-char", str(served_path), template, backend="hf")
    prompts = [r["question"] for r in rows[:3]]
    torch.manual_seed(0)
    answers = server.complete(prompts, 1, 0.0, 1.0, 24)
    adapted = HFGeneration(llama, lora=lora, chat_template="none")
    adapted.load_weights(torch.load(run_dir / "checkpoints" / "step_000002" / "llama-char" / "trainer_rank0.pt",
                                    weights_only=False)["model"], 2)
    greedy = adapted.generate(prompts, SamplingParams(1, 0.0, 1.0, 24))
    assert [a["texts"] for a in answers] == [c.responses for c in greedy]


@pytest.mark.slow
def test_lora_resume_equals_the_uninterrupted_run(lora_run):
    """The run folder as it was when the uninterrupted run had written its step-1 checkpoint (a
    copy, cut back to step 1: ``tests/run_copy.py``), resumed (``run.resume``), ends where the
    uninterrupted one ends: every store row, the final merged weights and the adapters, bit for
    bit. (The uninterrupted run's step-1 checkpoint is the stopped run's: a second run stopped
    there would write the same.)"""
    _, config, out = lora_run
    copy = out / "copy"
    cut = cut_back(out, "adapted", 1, copy)
    train(load_config(DEMO, [*RUN, f"run.output_dir={copy}", "run.name=adapted", "run.resume=true"]))
    key = ("step", "model", "prompt_id", "source_model", "sample")
    rows = {tuple(r[k] for k in key): r for r in read_store(cut)}
    ref = {tuple(r[k] for k in key): r for r in read_store(out / "adapted")}
    assert rows.keys() == ref.keys() and len(rows) > 0
    for k, row in rows.items():
        assert row == ref[k], k
    for name in ("llama-char", "gpt2-bpe"):
        assert (cut / "final" / name / "model.safetensors").read_bytes() == \
            (out / "adapted" / "final" / name / "model.safetensors").read_bytes()
    adapter = Path(ADAPTER_FOLDER) / "adapter_model.safetensors"
    assert (cut / "final" / "llama-char" / adapter).read_bytes() == \
        (out / "adapted" / "final" / "llama-char" / adapter).read_bytes()
    shutil.rmtree(copy, ignore_errors=True)
