"""A transfer is one file (issue #52): ``best_copy``, defined in this test file only, is a
policy side (which donor response each route carries) and a trainer side (its row kind: the rows
it puts into the train record, its own loss term and outcome column) in one registered class.
A real run of the demo pair takes it from the config (``exchange.transfer: {name: best_copy}``)
with no edit to the trainer, the update loop, the controller or the contracts: its rows and its
outcome column are in the trajectory store, and no file of the package names it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from graftpool.contracts import ROW_KINDS, ExchangeInput, Route
from graftpool.step_record import StepRecord
from policies.routing import Triple
from policies.transfer import Transfer, register_transfer
from workers.receiver.kinds import RowKind, TrainBatchBuilder, TrainerView
from workers.receiver.receiver_batch import ReceiverBatch
from workers.receiver.retokenize import retokenize, token_rows

NAME = "best_copy"
LOSS_WEIGHT = 0.5
ROOT = Path(__file__).resolve().parent.parent


class BestCopyRows(RowKind):
    """The trainer side: the donor's best response as a row of its own group, trained with
    advantage +1 by its own term, -LOSS_WEIGHT x A x (token-mean log-likelihood); its outcome
    column ``copy_logp`` is the receiver's pre-update token-mean log-likelihood of the copy."""

    name, order = NAME, 4
    outcome_columns = {"copy_logp": (None, "double")}

    def plan(self, batch: TrainBatchBuilder, route: Route, donor_rows: list[int], receiver: str) -> None:
        batch.add_rows(receiver, NAME, [donor_rows[i] for i in route.samples], advantages=[1.0])

    def add(self, rows: ReceiverBatch, view: TrainerView) -> None:
        step = rows.step
        mine = step.where(kind=NAME)
        prompts = [view.prompt_ids(step["prompt"][r]) for r in mine]
        responses = [retokenize(view.tokenizer, step["response"][r], step["finished"][r], view.end_id) for r in mine]
        scored = view.score_rows(token_rows(prompts, responses))
        for r, prompt, response, logp in zip(mine, prompts, responses, scored, strict=True):
            rows["n_tokens"][r], rows["weight"][r] = len(response), LOSS_WEIGHT
            if response:
                rows["copy_logp"][r] = float(logp.mean())
                rows.train(r, prompt, response, rows.new_group(True), peer=True, term=NAME)

    def loss(self, logp: torch.Tensor, mask: torch.Tensor, rows: StepRecord, settings) -> torch.Tensor:
        per_row = (logp * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        advantage = torch.tensor(rows["trained_advantage"], dtype=per_row.dtype, device=per_row.device)
        return -(LOSS_WEIGHT * advantage * per_row).mean()

    def received(self, batch: StepRecord, failed: set[str]) -> int:
        return len(batch.where(kind=NAME))


@register_transfer(NAME)
@dataclass
class BestCopy(Transfer):
    """The policy side: each routed triple carries the donor's best response (its highest reward)."""

    routings = ("pair", "pool")
    row_kinds = (BestCopyRows(),)

    def routes(self, triples: list[Triple], inp: ExchangeInput) -> list[Route]:
        return [Route(d, m, q, kind=NAME, samples=(int(np.argmax(inp.rewards[d, q])),)) for d, m, q in triples]


def test_registering_the_transfer_registers_its_row_kind():
    assert isinstance(ROW_KINDS.get(NAME), BestCopyRows)
    assert BestCopy().kind_modules() == (__name__,)


@pytest.mark.slow
def test_a_transfer_defined_in_one_test_file_trains_and_writes_its_rows_and_outcome_column(tmp_path, ray_local):
    from orchestrator.config import load_config
    from orchestrator.controller.loop import train

    config = load_config(ROOT / "configs" / "demo_pair.yaml", [
        "run.eval_every=0", "data.eval=[]", "run.steps=2", "algorithm.prompt_batch=16", "exchange.name=null",
        "exchange.routing=pair", f"exchange.transfer={{name: {NAME}}}", f"run.output_dir={tmp_path}",
        "run.name=plugin"])
    summary = train(config)
    files = sorted((tmp_path / "plugin" / "trajectories").glob("step_*.parquet"))
    rows = [row for f in files for row in pq.read_table(f).to_pylist()]
    copies = [r for r in rows if r["kind"] == NAME]
    assert copies, "no best_copy route in two steps of the demo pair"
    for r in copies:
        group = [o["reward"] for o in rows if o["kind"] == "own" and o["step"] == r["step"]
                 and o["model"] == r["source_model"] and o["prompt_id"] == r["prompt_id"]]
        assert r["model"] != r["source_model"] and r["reward"] == max(group) > 0.5  # the donor's best response
        assert r["advantage"] == 1.0 and r["weight"] == LOSS_WEIGHT and r["trained"] and r["update"] >= 0
        assert np.isfinite(r["copy_logp"]) and r["copy_logp"] < 0  # the receiver's pre-update log-likelihood
    assert all(r["copy_logp"] is None for r in rows if r["kind"] != NAME)
    assert sum(m["exchange"]["received"] for m in summary["models"].values()) == len(copies)
    # nothing but this file names the transfer: the trainer, update loop, controller and contracts
    # took it from its one registered class
    sources = [p for folder in ("graftpool", "policies", "workers", "orchestrator", "configs")
               for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".yaml")]
    assert sources and not [p for p in sources if NAME in p.read_text()]


def test_a_kinds_outcome_column_reads_back_across_steps_where_no_row_set_it(tmp_path):
    """A step where no row of the kind set its outcome column writes it as the declared type, so
    the store's files read back as one dataset (an inferred all-None column is Arrow's null type,
    and a later step's double then fails: 'Unsupported cast from double to null')."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    from graftpool.step_record import StepRecord
    from orchestrator.controller.records import store_table

    def train_record(kinds: list[str], copy_logp: list) -> StepRecord:  # a step's train record, two rows
        n = len(kinds)
        return StepRecord({
            "receiver": ["b"] * n, "kind": kinds, "prompt_id": ["q"] * n, "rendered_prompt": [None] * n,
            "prompt": ["1+1?"] * n, "sample": list(range(n)), "response": ["2"] * n, "n_tokens": [1] * n,
            "reward": [1.0] * n, "reason": ["correct"] * n, "trained_advantage": [0.5] * n,
            "source_model": ["b"] * n, "weight": [1.0] * n, "compat": [None] * n, "mean_logp": [-1.0] * n,
            "update": [0] * n, "policy_version": [0] * n, "copy_logp": copy_logp})

    # step 1: no row of the kind, every copy_logp the default None; step 2: one set
    for step, record in ((1, train_record(["own", "own"], [None, None])),
                         (2, train_record(["own", NAME], [None, -0.5]))):
        pq.write_table(store_table(step, record, {}), tmp_path / f"step_{step:06d}.parquet")
    table = ds.dataset(str(tmp_path), format="parquet").to_table()
    assert sorted(table.column("copy_logp").to_pylist(), key=str) == [-0.5, None, None, None]


def test_peer_output_slots_are_numbered_across_every_kind_that_hands_them_out():
    """A transfer's own kind takes a slot of the step's peer output, then HACPO's peer kind adds
    its rows to the same batch: every slot is distinct (a counter of the peer kind's own started
    again at 0 and one row's s and weight at its update would overwrite the other's)."""
    from graftpool.contracts import PEER
    from workers.receiver.kinds.peer import Peer
    from workers.zoo.model_zoo import build_tokenizer

    tok = build_tokenizer("char", [])
    rows = [{"kind": PEER, "group": 0, "prompt_id": "add-1", "prompt": "1+2=", "response": text, "finished": True,
             "mean_logp": -1.0, "source_model": "donor", "advantage": a, "reward": r}
            for text, a, r in (("3", 1.0, 1.0), ("4", -1.0, 0.0))]
    batch = ReceiverBatch(StepRecord.from_rows(rows))
    taken_first = batch.new_slot()  # another kind's row, added before the peer kind's
    view = TrainerView(tok, lambda prompt: tok(prompt)["input_ids"], lambda r: [], None, True, tok.eos_token_id)
    Peer().add(batch, view)
    slots = [taken_first, *(s for s in batch["slot"] if s >= 0)]
    assert len(slots) == 3 and sorted(slots) == [0, 1, 2], slots



SCRIPT = '''
import json
from dataclasses import dataclass

from policies.transfer import Transfer, register_transfer
from workers.receiver.kinds import RowKind


class ScriptRows(RowKind):
    name, order = "script_copy", 5


@register_transfer("script_copy")
@dataclass
class ScriptCopy(Transfer):
    routings = ("pair",)
    row_kinds = (ScriptRows(),)


if __name__ == "__main__":
    from orchestrator.config import load_config

    config = load_config(sys_root + "/configs/demo_pair.yaml", ["exchange.name=null", "exchange.routing=pair",
                                                              "exchange.transfer={name: script_copy}"])
    print(json.dumps(config.exchange.policy().trainer_params()["kind_modules"]))
else:
    print("imported as", __name__)
'''


def test_a_transfer_defined_in_the_script_a_job_runs_reaches_the_trainer_ranks(tmp_path, paths):
    """``ray job submit --working-dir . -- python my_run.py``, with the transfer defined in
    ``my_run.py``: its class is in ``__main__``, which in a trainer rank is Ray's worker script,
    so the rank imported that and had no row kind ('Route.kind: unknown row kind' at step 1).
    The rank is given the script's own module name, which it imports from the working directory
    (here a new interpreter there, building a real trainer); a script outside it is refused at load."""
    import json
    import os
    import subprocess
    import sys

    (tmp_path / "my_run.py").write_text(f"sys_root = {str(ROOT)!r}\n" + SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    driver = subprocess.run([sys.executable, "my_run.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert driver.returncode == 0, driver.stderr[-2000:]
    modules = json.loads(driver.stdout.strip().splitlines()[-1])
    rank = ("import sys\nfrom graftpool.contracts import ROW_KINDS\nfrom workers.training.trainer import TorchTrainer\n"
            f"TorchTrainer({str(Path(paths['llama-char']).resolve())!r}, kind_modules=tuple(sys.argv[1:]))\n"
            "print('script_copy' in ROW_KINDS.names())\n")
    trainer = subprocess.run([sys.executable, "-c", rank, *modules], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert trainer.returncode == 0, trainer.stderr[-2000:]
    # the rank registered the kind from the script's module, and the script's main block did not run there
    assert trainer.stdout.split() == ["imported", "as", "my_run", "True"], (modules, trainer.stdout)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    outside = subprocess.run([sys.executable, str(tmp_path / "my_run.py")], cwd=elsewhere, env=env,
                             capture_output=True, text=True)
    assert outside.returncode != 0 and "the trainer ranks cannot import from the working directory" in outside.stderr
