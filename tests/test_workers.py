"""Generation and trainer workers on real tiny models: log-probs agree, weights sync,
re-tokenisation, and data-parallel training over 2 Ray workers equals 1 worker."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from graftpool.contracts import GRAFT
from graftpool.step_record import StepRecord
from graftpool.tasks import generate_problems
from orchestrator.config import load_config
from tests.tiny_pair import batch_of, per_group, prepared
from tests.tiny_pair import grafts_for as _grafts_for
from workers.receiver.retokenize import token_rows
from workers.rollout.generation import HFGeneration, SamplingParams
from workers.training.trainer import TorchTrainer

ROOT = Path(__file__).resolve().parent.parent
TRAINER_ARGS = dict(lr=1e-3, minibatches=2, seed=0)


@pytest.mark.parametrize("name", ["llama-char", "gpt2-bpe"])
def test_generation_logprobs_match_the_trainers_old_logprobs(paths, rollouts, name):
    _, groups = rollouts
    trainer = TorchTrainer(paths[name], **TRAINER_ARGS)
    means = [trainer.score(g.record())["mean_logp"] for g in groups[name]]
    for group, mean in zip(groups[name], means, strict=True):
        gen_means = np.array([np.mean(lp) for lp in group.gen_logprobs])
        np.testing.assert_allclose(mean, gen_means, atol=1e-4)
        assert all(ids[-1] == trainer.tokenizer.eos_token_id for ids, done in
                   zip(group.token_ids, group.finished, strict=True) if done)


@pytest.mark.parametrize("name", ["llama-char", "gpt2-bpe"])
def test_shared_prompt_prefill_samples_what_the_unshared_one_does(paths, name, monkeypatch):
    """generate prefills each prompt once and copies its KV cache to the n samples: the same
    random draws give the same tokens and log-probs as n separate prefills."""
    import workers.rollout.generation as generation

    prompts = [p.prompt for p in generate_problems(["add", "sub"], 6, seed=3, split="train")]
    generator = HFGeneration(paths[name])
    params = SamplingParams(n=4, max_new_tokens=32)
    encoded = generator.tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    assert generation.shared_prompt_cache(generator.model, encoded, 4) is not None  # the shared path runs
    out = {}
    for shared in (True, False):
        if not shared:
            monkeypatch.setattr(generation, "shared_prompt_cache", lambda *args: None)
        torch.manual_seed(11)
        out[shared] = generator.generate(prompts, params)
    for a, b in zip(out[True], out[False], strict=True):
        assert a.token_ids == b.token_ids and a.responses == b.responses and a.finished == b.finished
        for la, lb in zip(a.logprobs, b.logprobs, strict=True):
            np.testing.assert_allclose(la, lb, atol=1e-5)


def test_weight_sync_changes_what_generation_samples(paths):
    prompts = [p.prompt for p in generate_problems(["add"], 6, seed=2, split="train")]
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
    generator = HFGeneration(paths["llama-char"])
    other = HFGeneration(paths["gpt2-bpe"])  # a different model's weights cannot load: shapes differ
    with pytest.raises(RuntimeError):
        generator.load_weights(other.model.state_dict(), 1)
    trainer = TorchTrainer(paths["llama-char"], **TRAINER_ARGS)
    with torch.no_grad():
        for param in trainer.model.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    before = [c.responses for c in generator.generate(prompts, greedy)]
    generator.load_weights(trainer.state_dict(), version=7)
    after = generator.generate(prompts, greedy)
    reference = HFGeneration(paths["llama-char"])
    reference.model.load_state_dict(trainer.model.state_dict())
    assert [c.responses for c in after] == [c.responses for c in reference.generate(prompts, greedy)]
    assert [c.responses for c in after] != before
    assert {c.policy_version for c in after} == {7}


def test_peer_strings_are_retokenised_with_the_receivers_tokenizer(paths, rollouts):
    _, groups = rollouts
    donor = TorchTrainer(paths["llama-char"], **TRAINER_ARGS)
    for group in groups["llama-char"]:
        group.mean_logp = np.asarray(donor.score(group.record())["mean_logp"])
    receiver = TorchTrainer(paths["gpt2-bpe"], **TRAINER_ARGS)
    grafts = [g for g in groups["llama-char"] if g.is_mixed][:3]
    assert grafts, "the llama model should have mixed groups on these prompts"
    batch = prepared(receiver.score, batch_of(groups["gpt2-bpe"], grafts))
    result = receiver.train(batch)
    graft_weight = per_group(batch, result, GRAFT, "weight")
    for graft, tokens, compat, weight in zip(grafts, per_group(batch, result, GRAFT, "n_tokens"),
                                             per_group(batch, result, GRAFT, "compat"), graft_weight, strict=True):
        expected = [len(receiver.tokenizer(t, add_special_tokens=False)["input_ids"]) + int(f)
                    for t, f in zip(graft.responses, graft.finished, strict=True)]
        assert tokens == expected
        s = np.array(compat)
        np.testing.assert_allclose(weight, np.where(s > 0.8, np.minimum(s, 1.0), 0.0))
    assert result.metrics["gate/offered"] == sum(len(g.responses) for g in grafts)
    # admission split by the sign of the donor's advantage (correct vs wrong peer responses)
    advantages = np.concatenate([g.advantages for g in grafts])
    admitted = np.concatenate([np.array(w) > 0 for w in graft_weight])
    for key, sign in (("gate/admission_rate_pos", advantages > 0), ("gate/admission_rate_neg", advantages < 0)):
        assert result.metrics[key] == pytest.approx(admitted[sign].mean())


def test_two_data_parallel_workers_equal_one(paths, rollouts, ray_local):
    ray = ray_local
    _, groups = rollouts
    own = groups["gpt2-bpe"]
    single = TorchTrainer(paths["gpt2-bpe"], **TRAINER_ARGS)
    initial = single.state_dict()
    batch = prepared(single.score, batch_of(own))  # pi_old under the initial weights every rank starts from
    single_result = single.train(batch)

    from orchestrator.cluster.model_actors import join_process_group

    cls = ray.remote(TorchTrainer)
    ranks = [cls.options(num_cpus=0.5).remote(str(paths["gpt2-bpe"]), rank=r, world_size=2, **TRAINER_ARGS)
             for r in range(2)]
    assert ray.get(ranks[0].rendezvous.remote())[0] == "127.0.0.1"  # rank 0's node: loopback here
    join_process_group(ranks)
    results = ray.get([t.train.remote(batch) for t in ranks])
    weights = ray.get([t.state_dict.remote() for t in ranks])
    # Summation order differs between one process and an all-reduce of two halves, and Adam's
    # first steps (update ~ lr * g / |g|) amplify float noise on near-zero gradients, so the
    # updates are compared as a whole: their difference is tiny next to the update itself.
    single_update = torch.cat([(v - initial[k]).flatten() for k, v in single.state_dict().items()])
    dp_update = torch.cat([(weights[0][k] - initial[k]).flatten() for k in initial])
    assert single_update.norm() > 0
    assert (dp_update - single_update).norm() / single_update.norm() < 2e-2
    for name in initial:
        torch.testing.assert_close(weights[1][name], weights[0][name], atol=0, rtol=0)
    assert results[0].metrics["train/own_tokens"] == single_result.metrics["train/own_tokens"]
    assert results[0].metrics["train/loss"] == pytest.approx(single_result.metrics["train/loss"], abs=1e-5)
    for actor in ranks:
        ray.kill(actor)


def test_sgt_items_are_learned_by_nll(paths, rollouts):
    """The SGT baseline's term pulls the receiver towards the peer's correct response."""
    problems, groups = rollouts
    receiver = TorchTrainer(paths["gpt2-bpe"], lr=3e-3, minibatches=1, seed=0)
    item = (problems[0].prompt, problems[0].solution)

    def nll() -> float:
        return -receiver.score_peers(StepRecord({"prompt": [item[0]], "response": [item[1]],
                                                 "finished": [True]}))["mean"][0]

    before = nll()
    for _ in range(5):
        result = receiver.train(batch_of(sgt=[item]))
    assert result.metrics["train/skipped_updates"] == 0
    assert nll() < before - 0.05


def test_an_on_policy_update_needs_no_old_logprob_pass(paths, rollouts):
    """One optimizer step per batch (minibatches x epochs = 1): with ``old_logprobs: auto`` the
    trainer needs no ``score`` pass and takes pi_old = sg(pi_theta); the update equals the
    recomputed one (same loss and pre-clip gradient norm, same gate), and a multi-step update
    whose own rows lack their ``old_logp`` is refused rather than trained against stale log-probs."""
    _, groups = rollouts
    own, grafts = groups["gpt2-bpe"], _grafts_for("gpt2-bpe", "llama-char", groups)
    for graft in grafts:
        graft.mean_logp = np.array([np.mean(lp) for lp in graft.gen_logprobs])
    assert grafts, "gpt2-bpe should fail some prompts llama-char has mixed groups on"
    args = dict(TRAINER_ARGS, minibatches=1)
    recomputed = TorchTrainer(paths["gpt2-bpe"], old_logprobs="recompute", **args)
    initial = recomputed.state_dict()
    expected = recomputed.train(prepared(recomputed.score, batch_of(own, grafts)))
    on_policy = TorchTrainer(paths["gpt2-bpe"], **args)  # auto
    assert not on_policy.takes_old_logp and recomputed.takes_old_logp
    got = on_policy.train(batch_of(own, grafts))
    for key in ("train/loss", "train/grad_norm", "train/own_tokens", "train/peer_tokens", "gate/admitted"):
        assert got.metrics[key] == pytest.approx(expected.metrics[key], rel=1e-5, abs=1e-7), key
    assert got.metrics["train/own_clip_frac"] == expected.metrics["train/own_clip_frac"] == 0.0
    np.testing.assert_allclose(got.outcomes["compat"], expected.outcomes["compat"], rtol=1e-6)
    expected_update = torch.cat([(v - initial[k]).flatten() for k, v in recomputed.state_dict().items()])
    update = torch.cat([(v - initial[k]).flatten() for k, v in on_policy.state_dict().items()])
    assert expected_update.norm() > 0
    assert (update - expected_update).norm() / expected_update.norm() < 1e-2  # Adam amplifies float noise
    stale = TorchTrainer(paths["gpt2-bpe"], **TRAINER_ARGS)  # 2 minibatches: pi_old must be recomputed
    with pytest.raises(RuntimeError, match="need their old_logp"):
        stale.train(batch_of(own))


def test_token_budget_micro_batches_give_the_row_split_update(paths, rollouts):
    """``max_tokens_per_micro_batch`` packs micro-batches by tokens (scoring and update) and
    changes nothing but the float summation order: the same loss, gate and update."""
    _, groups = rollouts
    own, grafts = groups["gpt2-bpe"], _grafts_for("gpt2-bpe", "llama-char", groups)
    for graft in grafts:
        graft.mean_logp = np.array([np.mean(lp) for lp in graft.gen_logprobs])
    results, updates = [], []
    for budget in (None, 200):
        trainer = TorchTrainer(paths["gpt2-bpe"], max_tokens_per_micro_batch=budget, logprob_chunk_tokens=64,
                               **TRAINER_ARGS)
        rows = token_rows([trainer._prompt_ids(g.prompt) for g in own for _ in g.token_ids],
                          [list(ids) for g in own for ids in g.token_ids])
        assert (len(trainer._micro_batches(rows, 1)) > 1) == (budget is not None)  # the budget splits
        initial = trainer.state_dict()
        results.append(trainer.train(prepared(trainer.score, batch_of(own, grafts))))
        updates.append(torch.cat([(v - initial[k]).flatten() for k, v in trainer.state_dict().items()]))
    whole, packed = results
    for key in ("train/loss", "train/grad_norm", "train/own_tokens", "train/peer_tokens", "gate/admitted"):
        assert packed.metrics[key] == pytest.approx(whole.metrics[key], rel=1e-5, abs=1e-7), key
    np.testing.assert_allclose(packed.outcomes["compat"], whole.outcomes["compat"], rtol=1e-5)
    assert (updates[1] - updates[0]).norm() / updates[0].norm() < 1e-2


def test_lower_cpu_priority_sets_every_thread_and_only_lowers():
    """Every thread running at the call gets the niceness (Linux keeps it per thread), a thread
    started later inherits it, and a lower niceness than the current one is left alone; in a
    child process, so this test's own priority stays. Relative to the niceness the test runs at
    (a CI runner may run niced)."""
    import os
    import subprocess
    import sys

    base = os.getpriority(os.PRIO_PROCESS, 0)
    if base > 16:
        pytest.skip(f"the test runs at niceness {base}: no room to lower the priority further")
    target = base + 3
    script = f"""
import os, threading
from workers.rollout.cpu_priority import lower_cpu_priority
stop = threading.Event()
before = threading.Thread(target=stop.wait); before.start()
print(lower_cpu_priority({target}), lower_cpu_priority({base}))
after = threading.Thread(target=stop.wait); after.start()
print(sorted({{os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}}))
stop.set()
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == [f"{target} {target}", f"[{target}]"]
    from workers.rollout.cpu_priority import lower_cpu_priority

    with pytest.raises(ValueError, match="0..19"):
        lower_cpu_priority(20)


def test_replicas_yield_the_cores_to_the_update_when_they_overlap(paths, ray_local):
    """``run.async: one_step`` on CPU: the replicas run at niceness 10 (``models[].generation.nice``
    auto), every thread of them, and the trainer at 0; a set ``nice`` wins, a GPU or a synchronous
    run leaves the priority alone. The update keeps the model's cores (2 threads for 1 + 1 CPUs),
    the replica gets its share (1), and both wait for work without spinning
    (``SHARED_CORES_ENV``); a synchronous spawn leaves the environment as it is."""
    import os

    from orchestrator.cluster.model_actors import (
        OVERLAP_NICE,
        SHARED_CORES_ENV,
        generation_nice,
        join_process_group,
        shares_cores,
        spawn_model_actors,
    )

    assert OVERLAP_NICE == 10
    # overlapped with both on CPU only; a replica or a trainer on a GPU leaves the cores to the
    # other, and an evaluation-only start (no trainer) has nothing to share them with
    assert [shares_cores(True, True, 0, 0), shares_cores(False, True, 0, 0), shares_cores(True, True, 1, 0),
            shares_cores(True, True, 0, 0.5), shares_cores(True, False, 0, 0)] == [True, False, False, False, False]
    assert [generation_nice(None, True), generation_nice(None, False), generation_nice(3, False),
            generation_nice(0, True)] == [10, 0, 3, 0]
    assert SHARED_CORES_ENV == {"OMP_WAIT_POLICY": "PASSIVE"}
    config = load_config(ROOT / "configs" / "demo_pair.yaml", [
        "run.async=one_step", "models.0.generation.num_cpus=1", "models.0.trainer.num_cpus=1"])

    def probe(actor) -> tuple[list[int], int, str | None]:
        """The niceness of each thread, torch's threads and the OpenMP wait policy of an actor."""
        return ray_local.get(actor.__ray_call__.remote(lambda self: (
            sorted({os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}),
            torch.get_num_threads(), os.environ.get("OMP_WAIT_POLICY"))))

    # the least nice thread of each (Ray runs a thread of its own at 15 in every worker),
    # against the niceness Ray's workers start at (this test's, on a runner that runs niced)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    # (an evaluation-only start of a one_step run, graftpool eval, has no update to yield to: its
    # replica keeps the model's generation CPU, 1 here, at the runner's niceness)
    for overlapped, with_trainer in ((True, True), (False, True), (True, False)):
        actors = spawn_model_actors(config.models[0], paths["llama-char"], config.algorithm, config.exchange,
                                    seed=0, with_trainer=with_trainer, overlapped=overlapped)
        join_process_group(actors.trainers)
        try:
            generator = probe(actors.generators[0])
            trainer = probe(actors.trainers[0]) if with_trainer else None
        finally:
            actors.shutdown()
        shared = overlapped and with_trainer
        policy = "PASSIVE" if shared else os.environ.get("OMP_WAIT_POLICY")
        assert (generator[0][0], generator[1:]) == (max(base, OVERLAP_NICE) if shared else base,
                                                    (1 if overlapped or not with_trainer else 2, policy))
        if with_trainer:
            assert (trainer[0][0], trainer[1:]) == (base, (2, policy))


def test_actors_run_as_many_threads_as_their_model_reserves(paths, ray_local):
    """A model's generation and training phases never overlap, so each actor runs torch on
    the model's whole CPU reservation, shared by the actors of the same phase."""
    from orchestrator.cluster.model_actors import (
        join_process_group,
        spawn_model_actors,
        threads_for,
    )

    assert [threads_for(1.0, 1), threads_for(2.0, 1), threads_for(2.0, 2), threads_for(3.0, 2),
            threads_for(0.5, 1), threads_for(2.0, 1, configured=3)] == [1, 2, 1, 1, 1, 3]
    config = load_config(ROOT / "configs" / "demo_pair.yaml", [
        "models.0.generation.num_cpus=1", "models.0.trainer.num_cpus=1", "models.0.generation.replicas=2"])
    actors = spawn_model_actors(config.models[0], paths["llama-char"], config.algorithm, config.exchange, seed=0)
    join_process_group(actors.trainers)
    try:
        def threads(actor):
            return ray_local.get(actor.__ray_call__.remote(lambda self: torch.get_num_threads()))

        # 2 replicas x 1 CPU + 1 trainer x 1 CPU = 3 CPUs: generation 3 // 2, training 3 // 1
        assert [threads(g) for g in actors.generators] == [1, 1]
        assert threads(actors.trainers[0]) == 3
    finally:
        actors.shutdown()
