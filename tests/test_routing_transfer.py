"""An exchange is a routing and a transfer, chosen apart (``exchange.routing`` x
``exchange.transfer``, docs/config.md#routing-and-transfer): a pairing that does not fit is
refused at load naming both; the older names are presets that route and store what their
policies did; and the pool routes SGT's transfer with its own donor strategies, in a real run
of three tiny models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from graftpool.contracts import GRAFT, PEER, SGT, SUCCESS_THRESHOLD, ExchangeInput, Route
from orchestrator.config import ConfigError, load_config
from orchestrator.controller.exchange import flow_matrix
from orchestrator.controller.loop import train
from orchestrator.controller.step_metrics import pool_metrics
from policies import make_policy
from policies.graft import balanced_selection
from tests.platform_checks import own_successes, read_store
from tests.shared_runs import SHORT_PAIR

ROOT = Path(__file__).resolve().parent.parent
DEMO, POOL3 = ROOT / "configs" / "demo_pair.yaml", ROOT / "configs" / "pool3.yaml"
SHORT = ["run.eval_every=0", "data.eval=[]"]
EXPLICIT = ["exchange.name=null"]


def _input(rewards: np.ndarray) -> ExchangeInput:
    m, p, _ = rewards.shape
    return ExchangeInput(models=[f"m{i}" for i in range(m)], prompt_ids=[f"q{j}" for j in range(p)], rewards=rewards)


def test_a_routing_and_a_transfer_that_do_not_fit_are_refused_at_load_naming_both():
    with pytest.raises(ConfigError, match=r"exchange.routing 'pool' and exchange.transfer 'hacpo' do not fit: "
                                          r"the transfer 'hacpo' takes the routings \['every_prompt'\]"):
        load_config(DEMO, [*EXPLICIT, "exchange.routing={name: pool, donor: random}", "exchange.transfer=hacpo"])
    with pytest.raises(ConfigError, match=r"exchange.routing 'every_prompt' and exchange.transfer 'sgt' do not fit"):
        load_config(DEMO, [*EXPLICIT, "exchange.routing=every_prompt", "exchange.transfer={name: sgt, coef: 0.2}"])
    # each half is checked on its own too, naming its field and parameter
    for overrides, message in [
        (["exchange.routing={name: pool, donor: best}"], r"exchange.routing.donor: expected 'most_successes' \|"),
        (["exchange.routing=pool", "exchange.transfer={name: sgt, count: 0}"], r"exchange.transfer.count: expected int"),
        (["exchange.transfer={name: sgt, lambda: 1}"], r"exchange.transfer: transfer 'sgt' has no parameter\(s\) \['lambda'\]"),
        (["exchange.routing=ring"], r"exchange.routing: unknown routing 'ring'"),
        (["exchange.transfer={coef: 1}"], r"exchange.transfer: .*expected a name or a mapping with a 'name'"),
        (["exchange.routing=pair", "exchange.params={balance: false}"], r"exchange.params are a preset's"),
        (["exchange.routing=pair", "exchange.transfer=luffy", "exchange.peer_ratio=clip"],
         r"exchange.peer_ratio: the policy 'pair\+luffy' sets peer_ratio = 'shaped'"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config(DEMO, [*EXPLICIT, *overrides])
    with pytest.raises(ConfigError, match=r"exchange.name \('graft'\) is a preset .* not both"):
        load_config(DEMO, ["exchange.routing=pool"])  # demo_pair.yaml names the graft preset
    with pytest.raises(ConfigError, match=r"exchange.routing: 'pair' pairs exactly 2 models, got 3"):
        load_config(POOL3, [*EXPLICIT, "exchange.params={}", "exchange.routing=pair", "exchange.transfer=sgt"])


def _old_sgt(inp: ExchangeInput, rng: np.random.Generator) -> list[Route]:
    """The ``sgt`` policy's plan before routing and transfer were split (policies/sgt.py, its own
    donor rule: per receiver and all-fail prompt, the live peer with the most successes)."""
    k, live, routes = inp.k, np.flatnonzero(inp.live), []
    for m in live:
        for q in np.flatnonzero(k[m] == 0):
            donors = [d for d in live if d != m and k[d, q] >= 1]
            if donors:
                d = min(donors, key=lambda i: (-k[i, q], i))
                sample = int(rng.choice(np.flatnonzero(inp.rewards[d, q] > SUCCESS_THRESHOLD)))
                routes.append(Route(int(d), int(m), int(q), kind=SGT, samples=(sample,)))
    return routes


def test_the_presets_route_what_their_policies_did():
    """On random reward tables of 2 to 4 models: ``sgt`` (pool routing, most_successes, no
    balance, with the sgt transfer) is SGT's own rule, step after step of one seeded stream;
    ``graft`` is Eq. 4 with the balanced exchange; an explicit pool + sgt equals the preset."""
    from policies import make_exchange

    gen = np.random.default_rng(0)
    for trial in range(60):
        models, n = int(gen.integers(2, 5)), 4
        preset = make_policy("sgt", seed=trial)
        explicit = make_exchange(routing={"name": "pool", "donor": "most_successes", "balance": "none"},
                                 transfer={"name": "sgt", "seed": trial})
        reference = np.random.default_rng(trial)
        for _ in range(3):
            inp = _input((gen.random((models, 12, n)) < gen.random((models, 12, 1)) ** 2).astype(float))
            want = _old_sgt(inp, reference)
            assert preset.plan(inp) == want == explicit.plan(inp)
        if models == 2:
            a_to_b, b_to_a = balanced_selection(inp.k[0], inp.k[1], n)
            want = sorted([Route(0, 1, int(q)) for q in np.flatnonzero(a_to_b)] +
                          [Route(1, 0, int(q)) for q in np.flatnonzero(b_to_a)], key=lambda r: (r.receiver, r.prompt))
            explicit_pair = make_exchange(routing={"name": "pair"}, transfer={"name": "graft"})
            assert make_policy("graft").plan(inp) == want == explicit_pair.plan(inp)


def _store_bytes(run_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in sorted((run_dir / "trajectories").rglob("*"))
            if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("preset, routing, transfer", [
    ("graft", "pair", "graft"),
    ("pool", "pool", "graft"),
    ("sgt", "{name: pool, donor: most_successes, balance: none}", "sgt"),
])
def test_a_preset_and_its_routing_and_transfer_write_the_same_store(tmp_path, ray_local, request, preset, routing,
                                                                   transfer):
    """The demo pair, 2 steps: the preset and its routing + transfer spelled out write
    byte-identical trajectory stores (and exchange something). The graft preset's run is the
    session's ``graft_pair_run`` (the same settings, ``tests/shared_runs.py``), which
    tests/test_gate_kinds.py reads too."""
    common = [*SHORT_PAIR, f"run.output_dir={tmp_path}"]
    if preset == "graft":
        preset_dir = request.getfixturevalue("graft_pair_run")
    else:
        train(load_config(DEMO, [*common, f"exchange.name={preset}", "run.name=preset"]))
        preset_dir = tmp_path / "preset"
    train(load_config(DEMO, [*common, *EXPLICIT, f"exchange.routing={routing}", f"exchange.transfer={transfer}",
                             "run.name=explicit"]))
    preset_store = _store_bytes(preset_dir)
    assert preset_store and preset_store == _store_bytes(tmp_path / "explicit")
    assert any(r["kind"] != "own" for r in read_store(preset_dir))


@pytest.mark.slow
def test_pool_routing_with_the_sgt_transfer_takes_correct_responses_from_several_donors(tmp_path, ray_local):
    """Three tiny models (configs/pool3.yaml), pool routing with ``least_used`` donors and no
    balance, SGT's transfer with two responses a route: every SGT row is a correct response of a
    peer that solved the prompt, on a prompt the receiver failed entirely, from one donor per
    (receiver, prompt), at most ``count`` of them; and a receiver learns from more than one peer."""
    config = load_config(POOL3, [*SHORT, *EXPLICIT, "exchange.params={}", "run.steps=2", "algorithm.prompt_batch=16",
                                 "exchange.routing={name: pool, donor: least_used, balance: none}",
                                 "exchange.transfer={name: sgt, coef: 0.2, count: 2}",
                                 f"run.output_dir={tmp_path}", "run.name=pool-sgt"])
    summary = train(config)
    rows = read_store(tmp_path / "pool-sgt")
    k = own_successes(rows)
    sgt: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["kind"] == SGT:
            sgt.setdefault((r["step"], r["model"], r["prompt_id"]), []).append(r)
    assert sgt, "no SGT route in two steps of the pool"
    donors_of: dict[str, set[str]] = {}
    not_the_best = 0  # routes whose donor is not the peer with the most successes: SGT's own rule would not pick it
    for (step, receiver, prompt), group in sgt.items():
        donors = {r["source_model"] for r in group}
        assert len(donors) == 1 and receiver not in donors, "one peer's responses per receiver and prompt"
        donor = donors.pop()
        assert k[step, receiver, prompt] == 0, "the receiver failed every rollout on the prompt"
        assert all(r["reward"] == 1.0 for r in group), "only correct responses"
        assert len(group) == min(2, k[step, donor, prompt]) and len({r["sample"] for r in group}) == len(group)
        donors_of.setdefault(receiver, set()).add(donor)
        best = max(k[step, peer, prompt] for peer in (m.name for m in config.models) if peer != receiver)
        not_the_best += k[step, donor, prompt] < best
    assert max(len(d) for d in donors_of.values()) >= 2, f"every receiver learnt from one peer only: {donors_of}"
    assert not_the_best > 0, "least_used never chose other than SGT's most-successful donor"
    assert sum(m["exchange"]["received"] for m in summary["models"].values()) == sum(len(g) for g in sgt.values())


def test_most_compatible_scores_the_groups_the_transfer_can_use():
    """Under ``most_compatible`` every receiver scores the donor groups the transfer can learn
    from: SGT's include an all-pass group (k = n), which GRAFT's (Eq. 4) leave out."""
    from orchestrator.controller.exchange import compatibility_requests
    from policies import make_exchange

    rewards = np.zeros((3, 2, 4))
    rewards[1, 0] = 1  # model 1 passes prompt 0 entirely: SGT can use it, GRAFT cannot
    rewards[2, 0, :2] = 1  # model 2 mixed on prompt 0
    inp = _input(rewards)
    routing = {"name": "pool", "donor": "most_compatible", "balance": "none"}
    sgt, graft = (make_exchange(routing=routing, transfer={"name": name}) for name in ("sgt", "graft"))
    assert sgt.needs_compatibility and graft.needs_compatibility
    assert compatibility_requests(inp, sgt.donor_groups(inp)) == {0: [(1, 0), (2, 0)], 1: [], 2: []}
    assert compatibility_requests(inp, graft.donor_groups(inp)) == {0: [(2, 0)], 1: [], 2: []}


def test_answer_starts_are_counted_for_the_rows_that_read_the_donors_tokens_only():
    """Only graft rows (``RowKind.donor_tokens``) read the donor's answer start, so the route phase
    asks each live donor model's trainer to count it for those rows alone: none for own, SGT or
    peer rows, none for a stored donor's (no trainer of its model runs)."""
    from graftpool.step_record import StepRecord
    from orchestrator.controller.exchange import donor_token_rows, train_record

    n, prompts = 2, ["p0", "p1"]
    models = ["a", "b", "c@store"]
    record = StepRecord({"model": [m for m in models for _ in prompts for _ in range(n)],
                         "prompt_id": [p for _ in models for p in prompts for _ in range(n)],
                         "advantage": [0.0] * (len(models) * len(prompts) * n)})
    inp = ExchangeInput(models=models, prompt_ids=prompts, rewards=np.zeros((3, 2, n)),
                        live=np.array([True, True, False]))
    routes = [Route(0, 1, 0), Route(0, 1, 1, kind=SGT, samples=(0,)), Route(2, 0, 1), Route(1, 0, 0, kind=PEER)]
    train = train_record(record, routes, inp)
    rows = donor_token_rows(train, ["a", "b"])
    assert list(rows) == ["a"]  # b gave a peer group only; the stored c is not live
    assert [(train["kind"][r], train["model"][r], train["prompt_id"][r]) for r in rows["a"]] == [(GRAFT, "a", "p0")] * n


def test_exchange_routes_is_the_flow_matrix_total_under_hacpo():
    """Issue #51's forty-sixth read: ``exchange/routes`` is F's total (docs/metrics.md), but it was
    ``len(routes)``, which under ``hacpo`` counts each model's own route on every prompt too (donor
    == receiver, nothing moved, not in F): 2 models on 1 prompt logged 4 routes for 2 groups moved."""
    routes = make_policy("hacpo").plan(_input(np.array([[[1.0, 0, 0, 0]], [[1.0, 1, 1, 0]]])))
    flow = flow_matrix(routes, 2)
    assert len(routes) == 4 and int(flow.sum()) == 2
    metrics = pool_metrics(flow, ["m0", "m1"], 2, {})
    assert metrics["exchange/routes"] == metrics["exchange/flow/m0/m1"] + metrics["exchange/flow/m1/m0"] == 2.0
