"""A run folder's disk without room for the checkpoints still to come stops the run at the save
that finds it, naming ``run.keep_checkpoints`` (issue #51's fifth read,
``orchestrator.controller.disk_room``): the GPU template's checkpoints on ``cluster.yaml``'s head
(75.6 GB each after the first update, three on the disk from the step-75 save on) did not fit its
200 GiB volume, and the job would have died in the middle of writing a checkpoint.

The checkpoint here is a real folder on this machine's disk, holding a sparse file whose size is
more than half the disk's free space: what a dense checkpoint of that size would be to the rule
(the sizes of its files), without writing it."""

from __future__ import annotations

import shutil

import pytest

from orchestrator.config import ConfigError
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
