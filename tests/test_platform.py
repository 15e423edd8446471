"""End-to-end runs of the Ray platform on CPU: real actors, real tiny models, real
math-verify, a real MLflow store. 2- and 3-model pools with different architectures and
tokenizers; the trajectory store is checked against Eq. 4 and the gate (Eqs. 7-8)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient
from transformers import AutoModelForCausalLM, AutoTokenizer

from orchestrator.config import load_config
from orchestrator.controller.loop import train
from orchestrator.models import resolve_model_path
from tests.platform_checks import (
    check_balance,
    check_hacpo_store,
    check_store,
    check_update_order,
    read_store,
)
from tests.reference import mean_logp, peer_tokens, prompt_tokens

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "configs" / "demo_pair.yaml"
POOL = ROOT / "configs" / "pool3.yaml"
SMALL = ["run.steps=2", "run.eval_every=2", "algorithm.prompt_batch=24", "eval.max_prompts=6",
         "eval.samples=2"]

NO_EVAL = ["run.eval_every=0", "data.eval=[]"]  # runs whose checks do not read pass@1

pytestmark = pytest.mark.slow


def _run(config_path: Path, out: Path, name: str, extra: list[str] = ()) -> tuple[dict, object]:
    config = load_config(config_path, [*SMALL, f"run.output_dir={out}", f"run.name={name}", *extra])
    return train(config), config


@pytest.fixture(scope="module")
def pair_run(tmp_path_factory, ray_local):
    out = tmp_path_factory.mktemp("runs")
    summary, config = _run(DEMO, out, "pair", ["run.checkpoint_every=1"])
    return summary, config, out / "pair"


def test_pair_run_writes_summary_config_and_final_models(pair_run):
    summary, config, run_dir = pair_run
    assert summary["steps"] == 2
    assert set(summary["models"]) == {"llama-char", "gpt2-bpe"}
    for model in summary["models"].values():
        assert set(model["final_pass@1"]) == {"add", "sub", "mod", "digits", "linear", "avg"}
        assert all(0.0 <= v <= 1.0 for v in model["final_pass@1"].values())
        assert set(model["best_pass@1"]) == set(model["final_pass@1"])
    assert set(summary["mean_step_time"]) == {"generate", "verify", "route", "score", "train", "sync"}
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    assert load_config(run_dir / "config.yaml") == config
    for name in summary["models"]:
        assert (run_dir / "final" / name / "config.json").is_file()


def test_pair_run_checkpoints_every_step_and_keeps_the_last_two(pair_run):
    _, _, run_dir = pair_run
    folders = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert folders == ["step_000001", "step_000002"]
    state = json.loads((run_dir / "checkpoints" / "step_000002" / "controller.json").read_text())
    assert state["step"] == 2 and state["sampler"]["cursor"] == 2 * 24
    for name in ("llama-char", "gpt2-bpe"):
        assert (run_dir / "checkpoints" / "step_000002" / name / "trainer_rank0.pt").is_file()


def test_pair_run_store_obeys_eq4_and_the_gate(pair_run):
    summary, config, run_dir = pair_run
    rows = read_store(run_dir)
    grafted = check_store(rows, config.algorithm.n, config.exchange.delta, 2, 24, ["llama-char", "gpt2-bpe"])
    assert grafted > 0, "exchange must actually happen on the demo pair"
    received = sum(m["exchange"]["received"] for m in summary["models"].values())
    assert received == grafted
    versions = {(r["model"], r["step"], r["policy_version"]) for r in rows if r["kind"] == "own"}
    assert {(m, s, s - 1) for m, s, _ in versions} == versions, "step s samples with policy version s-1"
    balance = check_balance(rows, "llama-char", "gpt2-bpe", config.algorithm.n)
    assert any(m > 0 for _, m, _ in balance), f"balancing must be exercised: {balance}"
    assert check_update_order(rows, peer_last=True, minibatches=config.algorithm.minibatches) > 0


def test_pair_run_pass_at_1_is_recomputed_from_the_stored_eval_responses(pair_run):
    """pass@1 by hand from ``evals/step_NNNNNN.parquet`` (orchestrator/controller/evaluate.py): per model and
    set, the mean over prompts of the share of samples that are successes (reward above 0.5,
    ``graftpool.contracts.pass_at_1``; math-verify's rewards are 0 or 1); ``avg`` is the plain mean of the
    per-set values (``Controller.evaluate`` in orchestrator/controller/loop.py: ``np.mean`` over the sets).
    It must equal summary.json's final_pass@1 and the ``eval/<set>/pass_at_1`` values in
    metrics.jsonl, and the stored rewards themselves must be math-verify's verdicts."""
    from math_verify import parse, verify

    from workers.verify.verifier import is_timeout, is_unjudged

    summary, config, run_dir = pair_run
    files = sorted(p.name for p in (run_dir / "evals").iterdir())
    assert files == ["step_000002.parquet"], "one evaluation (step 2 = the last), no temporary file"
    rows = pq.read_table(run_dir / "evals" / files[0]).to_pylist()
    samples, prompts, sets = config.eval.samples, config.eval.max_prompts, [e.name for e in config.data.eval]
    keys = {(r["model"], r["eval_set"], r["prompt_id"], r["sample"]) for r in rows}
    assert len(keys) == len(rows) == 2 * len(sets) * prompts * samples, "every sample once"
    assert {r["step"] for r in rows} == {2}
    by_prompt: dict[tuple, list[float]] = {}
    for r in rows:
        by_prompt.setdefault((r["model"], r["eval_set"], r["prompt_id"]), []).append(float(r["reward"] > 0.5))
    logged = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("step") == 2 and record.get("model"):
            logged.update({(record["model"], k): v for k, v in record["metrics"].items()
                           if k.startswith(("eval/", "verify/eval_"))})
    for model in ("llama-char", "gpt2-bpe"):
        by_hand = {}
        for eval_set in sets:
            groups = [v for (m, s, _), v in by_prompt.items() if (m, s) == (model, eval_set)]
            assert len(groups) == prompts and all(len(g) == samples for g in groups)
            by_hand[eval_set] = sum(sum(g) / len(g) for g in groups) / len(groups)
        by_hand["avg"] = sum(by_hand[s] for s in sets) / len(sets)
        final = summary["models"][model]["final_pass@1"]
        assert final.keys() == by_hand.keys()
        for key, value in by_hand.items():
            assert final[key] == pytest.approx(value, rel=1e-12, abs=1e-12), (model, key)
            assert logged[(model, f"eval/{key}/pass_at_1")] == pytest.approx(value, rel=1e-12, abs=1e-12)
        # the samples scored 0 for no fault of theirs, counted beside pass@1 (the forty-second read)
        reasons = [r["reason"] for r in rows if r["model"] == model]
        assert logged[(model, "verify/eval_failures")] == sum(is_unjudged(r) for r in reasons)
        assert logged[(model, "verify/eval_timeouts")] == sum(is_timeout(r) for r in reasons)
    # the rewards: math-verify itself on the stored response vs the gold answer, for responses
    # with one brace-free \boxed{...}; with none the reward is 0 by our rule (math-verify would
    # still pick a number out of the text); several or nested boxes are left out here
    checked = {0.0: 0, 1.0: 0}
    for r in rows:
        boxed = re.findall(r"\\boxed\{([^{}]*)\}", r["response"])
        if "\\boxed" not in r["response"]:
            assert r["reward"] == 0.0 and r["reason"] == "no \\boxed{} answer", r
            continue
        if r["response"].count("\\boxed") != 1 or len(boxed) != 1:
            continue
        expected = float(verify(parse(f"\\boxed{{{r['answer']}}}"), parse(r["response"])))
        assert r["reward"] == expected, (r["response"], r["answer"], r["reason"])
        assert (r["reason"] == "correct") == (expected == 1.0), r
        checked[expected] += 1
    assert checked[0.0] > 0 and checked[1.0] > 0, f"both verdicts re-verified: {checked}"


def test_pair_run_compat_is_a_separate_forward_of_the_receivers_saved_weights(pair_run):
    """Eq. 7 for every grafted row of both steps, recomputed outside the platform
    (``tests/reference.py``): the receiver's weights before the step (step 1: the zoo model;
    step 2: the step-1 checkpoint) score its re-tokenisation of the donor's string, minus the
    donor's own mean log-likelihood (the store's ``mean_logp``)."""
    _, config, run_dir = pair_run
    rows = [r for r in read_store(run_dir) if r["kind"] == "graft"]
    checked = 0
    for model_config in config.models:
        name = model_config.name
        path = resolve_model_path(model_config)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        for step in (1, 2):
            mine = [r for r in rows if r["model"] == name and r["step"] == step]
            if not mine:
                continue
            model = AutoModelForCausalLM.from_pretrained(str(path))
            if step == 2:
                saved = torch.load(run_dir / "checkpoints" / "step_000001" / name / "trainer_rank0.pt",
                                   weights_only=False)
                model.load_state_dict(saved["model"])
            for r in mine:
                q = prompt_tokens(tokenizer, r["rendered_prompt"])
                plain = peer_tokens(tokenizer, r["response"], finished=False)
                assert r["n_tokens"] in (len(plain), len(plain) + 1)
                o = peer_tokens(tokenizer, r["response"], finished=r["n_tokens"] == len(plain) + 1)
                s = np.exp(mean_logp(model, q, o) - r["mean_logp"])
                assert r["compat"] == pytest.approx(s, rel=2e-4), (step, name, r["prompt_id"], r["sample"])
                checked += 1
    assert checked == len(rows) > 0


def test_pair_run_digest_keeps_the_gates_histograms_of_every_graft_row(pair_run):
    """Issue #53: run_digest.json holds, per receiver and task, the histograms of ln s and of ln s
    per byte of the donor's correct and wrong responses; each sums to the store's graft rows of
    that split, and each row's value lands in its bin (n_A: the donor's own row, same sample)."""
    from benchmarks.gate_histograms import EDGES
    from benchmarks.learning_report import run_digest

    _, _, run_dir = pair_run
    rows = read_store(run_dir)
    run_digest(run_dir)
    gate = json.loads((run_dir / "run_digest.json").read_text())["gate_s"]
    assert gate["edges"] == EDGES and len(EDGES) == 41 and (EDGES[0], EDGES[-1]) == (-8.0, 2.0)
    own = {(r["step"], r["model"], r["prompt_id"], r["sample"]): r for r in rows if r["kind"] == "own"}
    expected: dict[tuple, dict[str, list[float]]] = {}
    for r in (r for r in rows if r["kind"] == "graft"):
        donor = own[r["step"], r["source_model"], r["prompt_id"], r["sample"]]
        assert donor["mean_logp"] == r["mean_logp"]  # the donor's own row of this response
        ln_s = np.log(r["compat"])
        per_byte = (r["n_tokens"] * (ln_s + r["mean_logp"]) - donor["n_tokens"] * r["mean_logp"]) / len(
            r["response"].encode())
        got = expected.setdefault((r["model"], r["task"], "correct" if r["reward"] > 0.5 else "wrong"),
                                  {"log_s": [], "log_s_per_byte": []})
        got["log_s"].append(ln_s)
        got["log_s_per_byte"].append(per_byte)
    assert expected and {k[2] for k in expected} == {"correct", "wrong"}
    for variant in ("log_s", "log_s_per_byte"):
        held = {(m, t, w): h for m, tasks in gate["models"].items() for t, v in tasks.items()
                for w, h in v[variant].items() if sum(h["counts"]) + h["under"] + h["over"] + h["missing"]}
        assert set(held) == set(expected), variant
        for key, h in held.items():
            x = np.array(expected[key][variant])
            assert sum(h["counts"]) + h["under"] + h["over"] + h["missing"] == len(x), (variant, key)
            assert h["counts"] == np.histogram(x[(x >= -8) & (x <= 2)], bins=EDGES)[0].tolist(), (variant, key)
            assert (h["under"], h["over"], h["missing"]) == ((x < -8).sum(), (x > 2).sum(), 0), (variant, key)


def test_pair_run_is_in_mlflow(pair_run):
    summary, config, run_dir = pair_run
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir.parent / 'mlflow.db'}")
    parent = client.get_run(summary["mlflow_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.params["exchange.name"] == "graft"
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert {c.data.tags["graftpool.model"] for c in children} == {"llama-char", "gpt2-bpe"}
    for child in children:
        metrics = child.data.metrics
        for key in ("exchange/all_fail_rate", "exchange/received", "train/reward_mean", "time/generate",
                    "time/train", "train/own_clip_frac", "eval/avg/pass_at_1"):
            assert key in metrics, key
        history = client.get_metric_history(child.info.run_id, "train/reward_mean")
        assert [m.step for m in history] == [1, 2]
    assert any(k.startswith("exchange/flow/") for k in parent.data.metrics)


def test_stored_peer_run_grafts_from_the_pair_runs_store(pair_run, tmp_path):
    """Figure 3b's setting: one live model, donor groups read from an earlier run's store."""
    _, _, run_dir = pair_run
    data = yaml.safe_load(DEMO.read_text())
    data["models"] = data["models"][:1]
    data["exchange"] = {"name": "stored",
                        "params": {"store": str(run_dir / "trajectories"), "peers": ["gpt2-bpe"]}}
    # ... and the live model trains data parallel over 2 Ray workers (gloo), its rank 0
    # broadcasting the weights to the replica after each step (collective weight sync)
    config = load_config(data=data, overrides=[*SMALL, f"run.output_dir={tmp_path}", "run.name=stored",
                                               "models.0.trainer.workers=2",
                                               "models.0.generation.weight_sync=collective"])
    summary = train(config)
    rows = read_store(tmp_path / "stored")
    grafted = check_store(rows, config.algorithm.n, config.exchange.delta, 2, 24, ["llama-char"])
    assert grafted > 0
    assert {r["source_model"] for r in rows if r["kind"] == "graft"} == {"gpt2-bpe@store"}
    # step 2 sampled with the weights rank 0 broadcast after step 1 (the replica's version)
    assert {(r["step"], r["policy_version"]) for r in rows if r["kind"] == "own"} == {(1, 0), (2, 1)}
    assert summary["models"]["llama-char"]["exchange"]["received"] == grafted


def test_three_model_pool_routes_each_all_fail_prompt_to_its_most_compatible_donor(tmp_path, ray_local, monkeypatch):
    """3 models, 3 architectures, 2 tokenizers, pool routing with donor=most_compatible: each
    receiver scores every eligible donor group before routing (compat[d, m, q]: the mean s of
    donor d's group on prompt q under receiver m's old weights), and each all-fail (receiver,
    prompt) takes the eligible donor of highest mean s (ties: more successes, then the lower
    index; policies/pool.py ``_choose_donor``). The chosen group's s are the gate's in the store:
    the same receiver weights scored them. (The default donor strategy's choices are checked
    by tests/test_pool.py without a run.)"""
    from graftpool.eligibility import eligibility
    from orchestrator.controller import loop, step_phases

    scored = []
    score = step_phases.compatibility_matrix

    def recording(record, inp, actors, usable):
        compat, logps = score(record, inp, actors, usable)
        scored.append((list(inp.models), list(inp.prompt_ids), inp.k.copy(), compat.copy()))
        return compat, logps

    monkeypatch.setattr(step_phases, "compatibility_matrix", recording)
    config = load_config(POOL, [*SMALL, f"run.output_dir={tmp_path}", "run.name=pool3",
                                "exchange.params={donor: most_compatible, balance: none}", *NO_EVAL])
    loop.Controller(config).run()
    models = [m.name for m in config.models]
    assert len({m.builder.arch for m in config.models}) == 3
    assert len({m.builder.tokenizer for m in config.models}) == 2
    rows = read_store(tmp_path / "pool3")
    n = config.algorithm.n
    assert check_store(rows, n, config.exchange.delta, 2, 24, models) > 0
    donors = {(r["source_model"], r["model"]) for r in rows if r["kind"] == "graft"}
    assert len(donors) >= 2, f"routes should use several donor->receiver pairs, got {donors}"
    assert len(scored) == 2, "one compatibility scoring per step"
    contested = differs = 0
    for step, (step_models, prompt_ids, k, compat) in enumerate(scored, 1):
        assert step_models == models
        eligible = eligibility(k, n)
        assert np.array_equal(np.isfinite(compat), eligible), "every eligible donor group scored, nothing else"
        chosen = {}
        for r in rows:
            if r["kind"] == "graft" and r["step"] == step:
                chosen.setdefault((models.index(r["model"]), prompt_ids.index(r["prompt_id"])), []).append(r)
        for m, q in zip(*np.nonzero(eligible.any(axis=0)), strict=True):
            candidates = np.flatnonzero(eligible[:, m, q])
            best = max(candidates, key=lambda d: (compat[d, m, q], k[d, q], -d))
            group = chosen.pop((m, q))  # balance none: every (receiver, all-fail prompt) with a donor is served
            assert {r["source_model"] for r in group} == {models[best]}, (models[m], prompt_ids[q], compat[:, m, q])
            s = [r["compat"] for r in group if np.isfinite(r["compat"])]
            # the gate takes the log-probs the routing pass computed: one score per response
            assert compat[best, m, q] == pytest.approx(np.mean(s), rel=1e-9), "routing s == the gate's s"
            contested += len(candidates) > 1
            differs += best != max(candidates, key=lambda d: (k[d, q], -d))
        assert not chosen, "no graft without an eligible donor"
    assert contested > 0, "some receiver must choose between two donors for the check to bite"
    print(f"most_compatible: {contested} (receiver, prompt) pairs had two donors, "
          f"{differs} chose another donor than most_successes would")


@pytest.mark.parametrize("ablation", [("exchange.peer_responses=success", "exchange.gate_scope=group"),
                                      ("exchange.peer_advantages=recentered", "exchange.gate=false",
                                       "exchange.peer_placement=first")], ids=["success-group", "recentered-nogate-first"])
def test_graft_ablations_reach_the_store(tmp_path, ray_local, ablation):
    """Success-only transfer trains only reward-1 peer rows, the group gate admits a donor group
    whole or not at all, recentered admitted advantages sum to zero per group, ``gate: false``
    admits every peer response with w = 1 and ``peer_last: false`` trains the peer minibatches
    first (in the store written by a real pair run, next to Eq. 4's and balancing's checks)."""
    _, config = _run(DEMO, tmp_path, "ablation", [*ablation, *NO_EVAL])
    rows = read_store(tmp_path / "ablation")
    grafted = check_store(rows, config.algorithm.n, config.exchange.delta, 2, 24, ["llama-char", "gpt2-bpe"],
                          transfer=config.exchange)
    assert grafted > 0
    check_balance(rows, "llama-char", "gpt2-bpe", config.algorithm.n)
    assert check_update_order(rows, config.exchange.peer_placement == "last", config.algorithm.minibatches) > 0
    if not config.exchange.gate:
        peers = [r for r in rows if r["kind"] == "graft"]
        assert all(r["trained"] for r in peers) and any(r["compat"] <= config.exchange.delta for r in peers), \
            "with the gate on, some of these responses would have been dropped"
    admitted = [r for r in rows if r["kind"] == "graft" and r["trained"]]
    assert admitted, "some peer responses must be admitted for the checks to bite"
    if "exchange.peer_advantages=recentered" in ablation:
        assert any(r["advantage"] != 0 for r in admitted)


def test_hacpo_pair_run_trains_every_peer_group(tmp_path, ray_local):
    """exchange: hacpo on the demo pair: each learner trains on its own group and the peer's
    whole group of every prompt, with HACPO's advantages recomputed from the store (the
    capability window spans both steps)."""
    summary, config = _run(DEMO, tmp_path, "hacpo", ["exchange.name=hacpo", *NO_EVAL])
    rows = read_store(tmp_path / "hacpo")
    check_hacpo_store(rows, config.algorithm.n, 2, 24, ["llama-char", "gpt2-bpe"])
    peers = [r for r in rows if r["kind"] == "peer"]
    assert any(r["trained"] for r in peers) and not all(r["trained"] for r in peers)
    for model in summary["models"].values():
        assert model["exchange"]["received"] > 0, "a peer group rescues some all-fail prompt"


def test_serve_and_eval_answer_openai_clients_and_score_alike(pair_run):
    """`graftpool serve`: the pair run's two final models behind one OpenAI-compatible Ray
    Serve endpoint on 127.0.0.1, queried with the openai client; the served model answers what
    its weights answer here (greedy), an unknown model is a 404, and `eval --endpoint` scores
    the eval sets as the eval command does through Ray actors (greedy: the same answers)."""
    from openai import NotFoundError, OpenAI
    from ray import serve

    from orchestrator.cli import main as cli_main
    from orchestrator.serving.endpoint_eval import evaluate_endpoint
    from orchestrator.serving.serve import start_serving
    from tests.netcut import free_port, listening_addresses
    from workers.rollout.generation import HFGeneration, SamplingParams

    _, config, run_dir = pair_run
    port = free_port()
    url = start_serving(run_dir, port)
    try:
        assert listening_addresses(port) == {"0100007F"}, "the Serve proxy listens on 127.0.0.1 only"
        client = OpenAI(base_url=url, api_key="unused", max_retries=0)
        assert sorted(m.id for m in client.models.list()) == ["gpt2-bpe", "llama-char"]
        prompt = "13+29=" + config.data.train.instruction
        local = HFGeneration(run_dir / "final" / "llama-char").generate([prompt], SamplingParams(1, 0.0, 1.0, 24))
        served = client.completions.create(model="llama-char", prompt=prompt, max_tokens=24, temperature=0)
        assert served.choices[0].text == local[0].responses[0]
        assert served.usage.completion_tokens == len(local[0].token_ids[0])
        chat = client.chat.completions.create(model="gpt2-bpe", messages=[{"role": "user", "content": prompt}],
                                              n=3, max_tokens=16, temperature=1.0)
        assert len(chat.choices) == 3 and all(c.message.role == "assistant" for c in chat.choices)
        with pytest.raises(NotFoundError):
            client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)

        greedy = ["eval.max_prompts=3", "eval.samples=1", "eval.temperature=0"]
        via_endpoint = evaluate_endpoint(run_dir, url, greedy)
    finally:
        serve.shutdown()
    # the eval command (in this process: the session's Ray) loads the final weights in actors
    assert cli_main(["eval", str(run_dir), *(arg for s in greedy for arg in ("--set", s))]) == 0
    via_actors = json.loads((run_dir / "eval.json").read_text())
    assert via_endpoint == via_actors and set(via_actors["llama-char"]) == {"add", "sub", "mod", "digits",
                                                                            "linear", "avg"}
    assert (run_dir / "eval.parquet").is_file()
