"""The demo pair's reference run, shared by the tests that interrupt the same run and must end
where it ends, all in ``tests/test_faults.py``: a SIGKILLed driver, killed actors, a trainer
node removed from a multi-node cluster. One uninterrupted run serves them all (``demo_reference`` in
``tests/conftest.py``), and :func:`assert_same_run` compares a run with it.

All runs verify with ``math`` (math-verify), as production does: every answer goes to the
verifier actor (``data.fast_path=false``), so killing it is felt. gpt2-bpe trains data parallel
over 2 ranks (gloo): a dead rank leaves its peer in a collective."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from orchestrator.config import load_config
from orchestrator.controller.evaluate import EVAL_SCHEMA, EVALS
from orchestrator.controller.loop import Controller
from tests.platform_checks import check_store, read_store

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "configs" / "demo_pair.yaml"
STEPS, PROMPTS = 4, 8
SMALL = [f"run.steps={STEPS}", "run.eval_every=2", f"algorithm.prompt_batch={PROMPTS}", "eval.max_prompts=2",
         "eval.samples=2", "run.checkpoint_every=1", "data.verifier=math", "data.verifier_actors=1",
         "data.fast_path=false", "tracking.views=false"]  # no run here is compared on its plots
PAIR = ["models.1.trainer.workers=2"]
KEY = ("step", "model", "prompt_id", "source_model", "sample")
EVAL_KEY = ("step", "model", "eval_set", "prompt_id", "sample")


def read_eval_responses(run_dir: Path) -> list[dict]:
    """Every evaluation row of a run, in step order."""
    files = sorted((Path(run_dir) / EVALS).glob("step_*.parquet"))
    return [row for f in files for row in pq.read_table(f, schema=EVAL_SCHEMA).to_pylist()]


def overrides(out: Path, name: str, extra: list[str] = PAIR) -> list[str]:
    """The reference's settings, for a run named ``name`` in ``out``."""
    return [*SMALL, f"run.output_dir={out}", f"run.name={name}", *extra]


def run_reference(out: Path, make=Controller) -> Path:
    """The uninterrupted run every interrupted one must end up equal to (``make``: the
    controller's class, or any callable from a config to one); its store checked."""
    make(load_config(DEMO, overrides(out, "ref"))).run()
    run_dir = out / "ref"
    config = load_config(run_dir / "config.yaml")
    check_store(read_store(run_dir), config.algorithm.n, config.exchange.delta, STEPS, PROMPTS,
                [m.name for m in config.models])
    assert not (run_dir / "plots").exists(), "tracking.views=false: no plot rendered or logged"
    return run_dir


def _keyed(rows: list[dict], key: tuple[str, ...]) -> dict[tuple, dict]:
    keyed = {tuple(r[k] for k in key): r for r in rows}
    assert len(keyed) == len(rows), f"a {key} appears twice"
    return keyed


def _metrics(run_dir: Path) -> dict[tuple, float]:
    """Every logged value but timings, the last one per (step, model, name) as dashboards read it."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "metrics" in record:
            for key, value in record["metrics"].items():
                if not key.startswith(("time/", "faults/")):
                    out[(record["step"], record["model"], key)] = value
    return out


def assert_same_run(run_dir: Path, reference: Path) -> None:
    """The run's store, evaluation responses, final pass@1, exchange totals, metrics and final
    weights equal the reference's."""
    rows, ref_rows = _keyed(read_store(run_dir), KEY), _keyed(read_store(reference), KEY)
    assert rows.keys() == ref_rows.keys()
    for key, row in rows.items():
        assert row == ref_rows[key], key
    evals = _keyed(read_eval_responses(run_dir), EVAL_KEY)
    ref_evals = _keyed(read_eval_responses(reference), EVAL_KEY)
    assert evals and evals.keys() == ref_evals.keys()  # every evaluation of the reference, once
    for key, row in evals.items():
        assert row == ref_evals[key], key
    summary = json.loads((run_dir / "summary.json").read_text())
    ref_summary = json.loads((reference / "summary.json").read_text())
    for name, model in ref_summary["models"].items():
        assert summary["models"][name] == model
    assert _metrics(run_dir) == _metrics(reference)
    for name in ref_summary["models"]:
        assert (run_dir / "final" / name / "model.safetensors").read_bytes() == \
            (reference / "final" / name / "model.safetensors").read_bytes()
