"""Guards that need no running job: a NaN/inf loss never reaches the weights; config, data,
model and tokenizer errors fail before any actor starts, naming the field, file and row;
resuming refuses a changed config and a fresh run refuses a folder with checkpoints;
secrets never reach MLflow params. Real models and files, no Ray."""

from __future__ import annotations

import copy
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from graftpool.tasks import generate_problems
from orchestrator.config import ConfigError, dump_config, load_config, redact
from orchestrator.controller.checkpoint import prepare_run_dir
from orchestrator.controller.loop import Controller
from orchestrator.models import resolve_model_path
from tests.rollouts import sampled_groups
from tests.tiny_pair import batch_of, prepared
from workers.training.trainer import TorchTrainer

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "configs" / "demo_pair.yaml"


@pytest.fixture(scope="module")
def llama() -> Path:
    return resolve_model_path(load_config(DEMO).models[0])


@pytest.fixture(scope="module")
def groups(llama):
    problems = generate_problems(["add"], 2, seed=3, split="train")
    return sampled_groups("llama-char", llama, problems, np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]]))


def _weights(trainer: TorchTrainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_loss_skips_its_update_and_never_writes_nan_weights(llama, groups, bad):
    good, poisoned = copy.deepcopy(groups[0]), copy.deepcopy(groups[1])
    poisoned.advantages = np.array([bad, 1.0, -1.0, 0.5])  # one row poisons its minibatch's loss

    alone = TorchTrainer(llama, lr=1e-2, minibatches=1, seed=0)  # only the good group
    alone.train(prepared(alone.score, batch_of([good])))

    both = TorchTrainer(llama, lr=1e-2, minibatches=2, seed=0)  # one minibatch per group
    before = _weights(both)
    result = both.train(prepared(both.score, batch_of([good, poisoned])))
    after = _weights(both)

    assert result.metrics["train/skipped_updates"] == 1.0
    assert all(torch.isfinite(v).all() for v in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in after), "the good minibatch did update"
    # the poisoned minibatch changed nothing: the weights are those of the good update alone
    assert all(torch.equal(after[k], v) for k, v in alone.model.state_dict().items())
    assert np.isfinite(result.metrics["train/loss"])

    only_bad = TorchTrainer(llama, lr=1e-2, minibatches=1, seed=0)
    before = _weights(only_bad)
    result = only_bad.train(prepared(only_bad.score, batch_of([poisoned])))
    assert result.metrics["train/skipped_updates"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in only_bad.model.state_dict().items())


def test_rows_of_a_skipped_micro_batch_are_not_reported_as_trained(llama, groups):
    """Issue #51's thirty-sixth read: one minibatch of two micro-batches (``grad_accum`` 2, one group
    each), the second's loss NaN: it is skipped and the first's update is taken. The store's
    ``update`` (and so ``trained``) of the skipped rows is -1, not the update their micro-batch
    never reached; before, every row of a minibatch that took a step was reported trained by it."""
    good, poisoned = copy.deepcopy(groups[0]), copy.deepcopy(groups[1])
    poisoned.advantages = np.array([float("nan"), 1.0, -1.0, 0.5])
    trainer = TorchTrainer(llama, lr=1e-2, minibatches=1, grad_accum=2, seed=0)
    result = trainer.train(prepared(trainer.score, batch_of([good, poisoned])))
    assert result.metrics["train/skipped_updates"] == 1.0 and result.metrics["train/updates"] == 1.0
    assert result.outcomes["update"] == [0] * good.n + [-1] * poisoned.n
    assert result.minibatches[0].rows == good.n  # and its rows and tokens are the good group's
    assert result.minibatches[0].tokens == sum(len(ids) for ids in good.token_ids)


def test_peer_rows_of_a_skipped_micro_batch_report_no_ratio_and_no_weight(llama, groups):
    """The same for HACPO's added peer rows (the ``sequence`` objective), whose s and weight come
    from their update's forward: a peer group whose loss is NaN is skipped, so its rows are stored
    untrained with s NaN and weight 0 and not counted admitted; before, they kept the s and weight
    of the skipped forward (here s 2.4 to 2.7, outside [lb, 1], so weight 0; a row inside it kept
    its weight and counted in ``gate/admitted``)."""
    from graftpool.contracts import ObjectiveSpec

    own, peer = copy.deepcopy(groups[0]), copy.deepcopy(groups[1])
    peer.mean_logp = np.full(peer.n, -1.0)  # the source side
    trainer = TorchTrainer(llama, lr=1e-2, minibatches=1, seed=0)
    batch = prepared(trainer.score, batch_of([own], peers=[(peer, [float("nan"), 1.0, -1.0, 0.5])]))
    result = trainer.train(batch, ObjectiveSpec("sequence", {"group_size": own.n}))
    assert result.metrics["train/skipped_updates"] == 1.0
    rows = range(own.n, own.n + peer.n)
    assert [result.outcomes["update"][r] for r in rows] == [-1] * peer.n
    assert [result.outcomes["weight"][r] for r in rows] == [0.0] * peer.n
    compat = [result.outcomes["compat"][r] for r in rows]
    assert all(np.isnan(s) for s in compat), f"s of a skipped forward stored: {compat}"
    assert result.metrics["gate/admitted"] == 0.0


def test_an_update_whose_gradient_norm_is_not_finite_takes_no_step(llama, groups):
    """A finite loss whose gradient's norm is not: advantages of 1e35 keep the loss (a mean over
    tokens) finite while the gradient's sum of squares overflows. The step is not taken (DeepSpeed
    skips such a step itself), is counted apart and is not reported as an update; taken, the
    clipped gradient (times 0 = max_norm / inf) still moved every weight through AdamW's decay,
    and an inf in the gradient itself would have made them NaN (inf x 0)."""
    huge = copy.deepcopy(groups[0])
    huge.advantages = np.full(len(huge.advantages), 1e35)
    trainer = TorchTrainer(llama, lr=1e-2, minibatches=1, seed=0)
    before = _weights(trainer)
    result = trainer.train(prepared(trainer.score, batch_of([huge])))
    assert result.metrics["train/skipped_updates"] == 0.0, "the loss was finite"
    assert result.metrics["train/nonfinite_grad_steps"] == 1.0
    assert result.metrics["train/updates"] == 0.0 and result.minibatches == []
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


# -- errors before any actor -------------------------------------------------------------


def _fails_before_actors(config, match: str) -> None:
    controller = Controller(config)
    with pytest.raises(ConfigError, match=match):
        controller.start()
    assert not hasattr(controller, "actors") and not hasattr(controller, "started_ray")


def test_tokenizer_without_eos_token_fails_before_any_actor(llama, tmp_path):
    """(No pad token is no error: EOS pads, tests/test_pad_token.py.)"""
    model = tmp_path / "noeos"
    shutil.copytree(llama, model)
    tok_config = json.loads((model / "tokenizer_config.json").read_text())
    tok_config.pop("eos_token", None)
    (model / "tokenizer_config.json").write_text(json.dumps(tok_config))
    data = yaml.safe_load(DEMO.read_text())
    data["models"][0] = {"name": "noeos", "path": str(model)}
    config = load_config(data=data, overrides=[f"run.output_dir={tmp_path}"])
    _fails_before_actors(config, r"models.noeos: .*noeos: the tokenizer has no EOS token")


@pytest.mark.parametrize(("rows", "match"), [
    ([], r"train.jsonl: no rows"),
    ([{"problem": "1+1", "answer": "2"}, {"problem": "2+2"}], r"train.jsonl: row 2 has no 'answer'"),
    ([{"problem": "1+1", "answer": "2"}, {"problem": " ", "answer": "4"}], r"train.jsonl: row 2 has no 'problem'"),
])
def test_data_errors_name_file_and_row_before_any_actor(tmp_path, rows, match):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = load_config(DEMO, [f"run.output_dir={tmp_path}", "data.train.source=jsonl", f"data.train.path={path}"])
    _fails_before_actors(config, match)


def test_eval_set_overlapping_the_train_set_is_a_warning(tmp_path):
    from orchestrator.controller.prompts import load_data

    path = tmp_path / "evalset.jsonl"
    path.write_text(json.dumps({"problem": "What is 1+1?", "answer": "2"}) + "\n")
    config = load_config(DEMO, ["data.train.source=jsonl", f"data.train.path={path}",
                                "data.eval=[{name: dup, source: jsonl, path: " + str(path) + "}]"])
    with pytest.warns(UserWarning, match="data.eval 'dup': 1 prompts also in the train set"):
        load_data(config.data.train, config.data.eval)


def test_a_train_set_smaller_than_the_prompt_batch_is_said_once():
    from graftpool.tasks import generate_problems
    from orchestrator.controller.prompts import PromptSampler

    sampler = PromptSampler(generate_problems(["add"], 3, seed=0), seed=0)
    with pytest.warns(UserWarning, match=r"data.train holds 3 prompts, fewer than algorithm.prompt_batch \(8\)"):
        assert len(sampler.next_batch(8)) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(sampler.next_batch(8)) == 3 and len(sampler.next_batch(2)) == 2


def test_a_train_file_that_repeats_its_questions_fills_a_batch_of_its_distinct_prompts(tmp_path):
    """A parquet train file of 200 rows, 50 questions each 4 times (no id_field: a repeated
    question is one prompt id), under a prompt batch of 128: the batch is the 50 distinct
    prompts, said once; the sampler looped forever looking for 128 distinct ids in 200 rows.
    SIGALRM only ends a hang with a message: a working sampler returns at once."""
    import signal

    import pyarrow as pa
    import pyarrow.parquet as pq

    from graftpool.data_files import load_table
    from orchestrator.controller.prompts import PromptSampler

    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"problem": [f"What is {i % 50} + 1?" for i in range(200)],
                             "answer": [str(i % 50 + 1) for i in range(200)]}), path)
    sampler = PromptSampler(load_table(path), seed=0)

    def hung(signum, frame):
        raise AssertionError("next_batch never returned: it looks for more distinct prompts than the file holds")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        with pytest.warns(UserWarning, match=r"data.train holds 50 prompts \(200 rows\), fewer than "
                                             r"algorithm.prompt_batch \(128\)"):
            batch = sampler.next_batch(128)
        assert sorted(p.answer for p in batch) == sorted(str(i + 1) for i in range(50))
        assert len(sampler.next_batch(20)) == 20
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# -- resume guards -----------------------------------------------------------------------


def test_resume_refuses_a_changed_config_and_a_fresh_run_refuses_checkpoints(tmp_path):
    config = load_config(DEMO, [f"run.output_dir={tmp_path}", "run.name=r"])
    run_dir = tmp_path / "r"
    (run_dir / "checkpoints" / "step_000003").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_000003" / "controller.json").write_text('{"step": 3}')
    (run_dir / "checkpoints" / ".tmp-step_000004").mkdir()  # an unfinished save is no checkpoint
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json")))
    with pytest.raises(ConfigError, match="holds checkpoints of an earlier run .*--resume"):
        prepare_run_dir(run_dir, config)
    resumed = load_config(DEMO, [f"run.output_dir={tmp_path}", "run.name=r", "run.resume=true", "run.steps=50"])
    assert prepare_run_dir(run_dir, resumed) == run_dir / "checkpoints" / "step_000003"
    changed = load_config(DEMO, [f"run.output_dir={tmp_path}", "run.name=r", "run.resume=true",
                                 "algorithm.n=4", "models.1.trainer.lr=0.5"])
    with pytest.raises(ConfigError, match=r"differs from .* in algorithm.n, models.1.trainer.lr"):
        prepare_run_dir(run_dir, changed)
    short = load_config(DEMO, [f"run.output_dir={tmp_path}", "run.name=r", "run.resume=true", "run.steps=2"])
    with pytest.raises(ConfigError, match=r"run.steps is 2 but the latest checkpoint .* is at step 3"):
        prepare_run_dir(run_dir, short)


def test_a_fresh_run_drops_an_earlier_runs_trajectories_and_evaluations(tmp_path):
    config = load_config(DEMO, [f"run.output_dir={tmp_path}", "run.name=r"])
    store, evals = tmp_path / "r" / "trajectories", tmp_path / "r" / "evals"
    for folder in (store, evals):
        folder.mkdir(parents=True)
        (folder / "step_000009.parquet").write_text("stale")
    (evals / "step_000010.parquet.tmp").write_text("half-written")
    (store / ".step_000010.parquet.tmp").write_text("half-written")  # the store writer's hidden name
    with pytest.warns(UserWarning, match="dropping 4 trajectory and evaluation files"):
        assert prepare_run_dir(tmp_path / "r", config) is None
    assert not list(store.iterdir()) and not list(evals.iterdir())


# -- secrets -------------------------------------------------------------------------------


def test_secrets_never_reach_mlflow_params():
    config = load_config(DEMO, ["tracking.uri=https://alice:s3cret@mlflow.example:5000",
                                "exchange.name=sgt", "exchange.params={coef: 0.1}"])
    dumped = json.dumps(redact(config.model_dump(mode="json")))
    assert "s3cret" not in dumped and "https://***@mlflow.example:5000" in dumped
    assert "s3cret" not in dump_config(config)  # the run folder's config.yaml, an MLflow artifact
    assert redact({"params": {"hf_token": "abc", "api_key": "k", "store": "x"}}) == \
        {"params": {"hf_token": "***", "api_key": "***", "store": "x"}}
