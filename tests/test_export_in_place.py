"""The final export over an earlier one (a finished run resumed for more ``run.steps``, docs/operations.md)
stopped part way (``ray job stop``, a lost head) left ``final/<model>`` holding some of the new export's
files beside the earlier one's: a model of two runs' weights, which ``graftpool eval`` and ``serve`` load
as any folder. ``export_trainers`` writes each model into ``final/.tmp-<model>`` and puts it in place
once whole. The trainers are stand-ins that write a sharded folder, on the ranks' shared disk and
through the driver (``orchestrator.controller.node_layout``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.controller import node_layout

SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json")


def write_export(folder: Path, tag: str, stop_after: int | None = None) -> None:
    """A sharded export's files, each holding ``tag``; a stop after ``stop_after`` files."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(SHARDS):
        if stop_after is not None and i == stop_after:
            raise KeyboardInterrupt("stopped during the export")
        (folder / name).write_text(f"{tag} {name}")


def controller(tmp_path: Path, shared: bool, monkeypatch, stop_after: int | None) -> SimpleNamespace:
    def on_trainers(method, *args):
        if shared:  # rank 0 writes into the folder the driver names
            write_export(Path(args[0]), "new", stop_after)
        return SimpleNamespace(refs=[])

    monkeypatch.setattr(node_layout, "get_all", lambda refs: [{"files": "of rank 0"}])
    monkeypatch.setattr(node_layout, "fetch_rank_files",  # the driver writes rank 0's chunks, file by file
                        lambda rank, files, folder: write_export(Path(folder), "new", stop_after))
    actors = SimpleNamespace(on_trainers=on_trainers, trainers=["rank 0"])
    return SimpleNamespace(names=["m"], shared={"m": shared}, actors={"m": actors}, run_dir=tmp_path)


@pytest.mark.parametrize("shared", [True, False], ids=["shared-disk", "through-the-driver"])
def test_an_export_stopped_part_way_leaves_the_earlier_one_whole(tmp_path, monkeypatch, shared):
    final = tmp_path / "final"
    write_export(final / "m", "old")
    with pytest.raises(KeyboardInterrupt):
        node_layout.export_trainers(controller(tmp_path, shared, monkeypatch, stop_after=1), final)
    held = {p.name: p.read_text() for p in (final / "m").iterdir()}
    assert held == {name: f"old {name}" for name in SHARDS}, "final/m mixes two exports' files"

    node_layout.export_trainers(controller(tmp_path, shared, monkeypatch, stop_after=None), final)  # done again
    assert {p.name: p.read_text() for p in (final / "m").iterdir()} == {name: f"new {name}" for name in SHARDS}
    assert sorted(p.name for p in final.iterdir()) == ["m"], "a staging or earlier folder left behind"
