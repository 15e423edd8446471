"""A run folder's disk without room for the checkpoints still to come stops the run at the save
that finds it, naming ``run.keep_checkpoints`` (issue #51's fifth read,
``orchestrator.controller.disk_room``): the GPU template's checkpoints on ``cluster.yaml``'s head
(75.6 GB each after the first update, three on the disk from the step-75 save on) did not fit its
200 GiB volume, and the job would have died in the middle of writing a checkpoint.

The checkpoint here is a real folder on this machine's disk, holding a sparse file whose size is
more than half the disk's free space: what a dense checkpoint of that size would be to the rule
(the sizes of its files), without writing it."""

from __future__ import annotations

import json
import shutil

import pytest

from orchestrator.config import ConfigError
from orchestrator.controller.checkpoint import prepare_run_dir
from orchestrator.controller.disk_room import check_room, folder_bytes, saves_to_come


def _checkpoint(tmp_path, size: int):
    folder = tmp_path / "checkpoints" / "step_000000"
    (folder / "qwen").mkdir(parents=True)
    with (folder / "qwen" / "optim_states.pt").open("wb") as f:
        f.truncate(size)  # sparse: no block written
    (folder / "controller.json").write_text("{}")
    return folder


def test_a_disk_short_of_the_saves_to_come_stops_the_run_naming_the_field(tmp_path):
    size = shutil.disk_usage(tmp_path).free // 2 + 2**30
    folder = _checkpoint(tmp_path, size)
    assert folder_bytes(folder) == size + 2
    with pytest.raises(ConfigError) as caught:  # two more at once: keep 2, the third written whole first
        check_room(folder, present=1, future=20, keep=2)
    said = str(caught.value)
    assert said.startswith("run.keep_checkpoints: the run folder's disk") and "2 more on the disk at once" in said
    assert f"{(2 * (size + 2)) / 1e9:.1f} GB more" in said and "step_000000" in said
    check_room(folder, present=1, future=20, keep=1)  # one more at once: half the free space and a GiB
    check_room(folder, present=1, future=1, keep=2)  # one save to come
    check_room(folder, present=2, future=5, keep=2)  # two on the disk already: one more at the peak
    check_room(folder, present=1, future=0, keep=2)  # the last save


def test_the_saves_to_come_are_the_steps_checkpoint_every_divides():
    assert saves_to_come(0, 500, 25) == 20  # configs/gpu/graft_pair_3b.yaml after its step-0 checkpoint
    assert saves_to_come(25, 500, 25) == 19
    assert saves_to_come(490, 500, 25) == 1
    assert saves_to_come(500, 500, 25) == 0
    assert saves_to_come(3, 10, 4) == 2  # steps 4 and 8
    assert saves_to_come(0, 10, 0) == 0  # run.checkpoint_every 0: none


def _run_folder(tmp_path, keep: int, size: int):
    """A run folder of the GPU template's checkpoint schedule (every 25 of 500 steps) stopped by the
    rule at its step-50 save: checkpoints 25 and 50 (``size`` bytes of sparse optimiser state each),
    the config it ran, and a resume of it with ``run.keep_checkpoints`` = ``keep``."""
    from orchestrator.config import dump_config, load_config
    from tests.shared_runs import DEMO

    overrides = [f"run.output_dir={tmp_path}", "run.name=r", "run.steps=500", "run.checkpoint_every=25"]
    run_dir = tmp_path / "r"
    for step in (25, 50):
        folder = _checkpoint(run_dir, size)
        folder.rename(run_dir / "checkpoints" / f"step_{step:06d}")
        (run_dir / "checkpoints" / f"step_{step:06d}" / "controller.json").write_text(json.dumps({"step": step}))
    (run_dir / "checkpoints" / ".tmp-step_000075").mkdir()  # a later save that died half-way
    (run_dir / "config.yaml").write_text(dump_config(load_config(DEMO, overrides)))
    return run_dir, load_config(DEMO, [*overrides, "run.resume=true", f"run.keep_checkpoints={keep}"])


def test_a_resume_keeping_fewer_checkpoints_deletes_the_older_ones_before_its_first_save(tmp_path):
    """The disk-room error advises a lower ``run.keep_checkpoints`` and ``--resume``: the resumed
    folder holds that many before its first save, whose peak is then keep + 1 (issue #51's
    thirty-fifth read; before: both kept until that save had written a third whole)."""
    run_dir, resumed = _run_folder(tmp_path, keep=1, size=2**20)
    assert prepare_run_dir(run_dir, resumed) == run_dir / "checkpoints" / "step_000050"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000050"]


def test_a_resume_on_a_disk_short_of_its_saves_to_come_stops_before_any_step(tmp_path):
    """Nothing changed since the rule stopped the run: the resume is stopped at its start, naming
    the field, not at its step-75 save half-way through that save's files."""
    size = shutil.disk_usage(tmp_path).free + 2**30
    run_dir, resumed = _run_folder(tmp_path, keep=2, size=size)
    with pytest.raises(ConfigError, match=r"run.keep_checkpoints: the run folder's disk .* step_000050 is"):
        prepare_run_dir(run_dir, resumed)
