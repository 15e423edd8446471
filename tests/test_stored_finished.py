"""The ``stored`` routing re-tokenises a stored response cut at its model's ``max_new_tokens`` without
the receiver's end (issue #51's thirty-sixth read): the trajectory store keeps whether each response
was finished (``finished``), and ``StoredPeers.record`` hands it on. Before, the store had no such
column and every stored response was taken as finished, so a cut one was grafted (or, for SGT,
trained) with the receiver's end token appended where its model never stopped: scored into the
gate's s and trained at a place its own policy does not end, as a live donor's cut response is not.

The store is written by the run's own code (``records.store_table``, ``TrajectoryStore``) from a
train record of two own responses, one finished and one cut."""

from __future__ import annotations

import pyarrow.parquet as pq

from graftpool.step_record import StepRecord
from orchestrator.controller.records import store_table
from orchestrator.controller.trajectory_store import TrajectoryStore
from policies.stored import StoredPeers
from workers.receiver.retokenize import retokenize
from workers.rollout.tokenizer import load_tokenizer

COLUMNS = ["model", "prompt_id", "sample", "prompt", "response", "token_ids", "finished", "reward", "advantage",
           "mean_logp"]


def _train_record() -> StepRecord:
    rows = [dict(receiver="peer", model="peer", prompt_id="p0", sample=i, prompt="12+35=", rendered_prompt="12+35=",
                 response=text, n_tokens=len(text), reward=reward, reason="", trained_advantage=advantage,
                 advantage=advantage, source_model="peer", kind="own", weight=1.0, compat=None, mean_logp=-1.0,
                 update=0, policy_version=1, finished=finished)
            for i, (text, finished, reward, advantage) in enumerate([("47", True, 1.0, 0.7),
                                                                     ("4444444444", False, 0.0, -0.7)])]
    return StepRecord.from_rows(rows, list(rows[0]))


def test_a_stored_response_cut_at_the_budget_is_not_taken_as_finished(tmp_path, paths):
    store = TrajectoryStore(tmp_path / "trajectories")
    store.write_table(1, store_table(1, _train_record(), {"p0": "add"}))
    peers = StoredPeers(store.folder, "peer")
    record = peers.record(["p0"], ["12+35="], COLUMNS)
    assert record["response"] == ["47", "4444444444"]
    assert record["finished"] == [True, False]
    receiver = load_tokenizer(paths["llama-char"])
    cut = retokenize(receiver, record["response"][1], record["finished"][1])
    assert cut[-1] != receiver.eos_token_id  # no end where the stored model never stopped


def test_a_store_whose_first_steps_predate_the_column_still_reads_it_from_later_ones(tmp_path):
    """A run started before the store had ``finished`` and resumed with a GraftPool that writes it:
    its first step files lack the column, its later ones hold it. A Parquet dataset takes its
    first file's schema, so the column was dropped for every step and a later step's cut response
    was taken as finished; the kept group here is step 2's (the latest), written with the column."""
    store = TrajectoryStore(tmp_path / "trajectories")
    store.write_table(1, store_table(1, _train_record(), {"p0": "add"}).drop(["finished"]))  # the older writer's
    store.write_table(2, store_table(2, _train_record(), {"p0": "add"}))
    record = StoredPeers(store.folder, "peer").record(["p0"], ["12+35="], COLUMNS)
    assert record["finished"] == [True, False]


def test_a_step_file_a_killed_writer_left_half_written_is_not_read(tmp_path):
    """A job killed while it wrote a step's file leaves that file under the name ``write_table``
    writes it to before its rename; the folder, used as a ``stored`` routing's store (or read by
    ``TrajectoryStore.read``) before any resume cleaned it, is read without it. Before, the file
    was ``step_NNNNNN.parquet.tmp``, which a Parquet dataset over the folder opens: the half file
    failed the read (``ArrowInvalid``), a whole one was read as a step the run never finished."""
    store = TrajectoryStore(tmp_path / "trajectories")
    store.write_table(1, store_table(1, _train_record(), {"p0": "add"}))
    half = store.tmp_path_for(2)
    pq.write_table(store_table(2, _train_record(), {"p0": "add"}), half)
    half.write_bytes(half.read_bytes()[: half.stat().st_size // 2])  # the kill, mid-write
    record = StoredPeers(store.folder, "peer").record(["p0"], ["12+35="], COLUMNS)
    assert record["finished"] == [True, False]
    assert store.read()["step"].to_pylist() == [1, 1]
    store.drop_after(1)  # a resume cleans it up
    assert not half.exists()


def test_a_store_with_no_step_file_yet_is_refused_naming_it(tmp_path):
    """The store folder of a run stopped before its first step was written (the folder is made at
    start-up; here with a killed writer's hidden file in it) named as a ``stored`` routing's store:
    the start is refused naming the store and the field. Since the columns were unified over the
    step files (the thirty-seventh read), no file meant ``pa.unify_schemas([])``, whose
    ``ArrowInvalid: Must provide at least one schema to unify`` named neither (the thirty-eighth read)."""
    import pytest

    store = TrajectoryStore(tmp_path / "trajectories")
    pq.write_table(store_table(1, _train_record(), {"p0": "add"}), store.tmp_path_for(1))
    with pytest.raises(ValueError, match=r"exchange.params.store: the trajectory store .*trajectories holds no step"):
        StoredPeers(store.folder, "peer")
