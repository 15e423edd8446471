"""Raw benchmark data out of the tree and back (benchmarks/archive.py), on a git repository made
here: a folder recorded at a commit, removed by a later one, unpacked from the history exactly
(its tree id checked first); a manifest that does not match the history is refused."""

from __future__ import annotations

import subprocess

import pytest

from benchmarks.archive import ArchiveError, fetch, record


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_a_removed_folder_comes_back_from_history_checked(tmp_path):
    repo = tmp_path / "repo"
    runs = repo / "results" / "runs" / "graft-s0"
    (runs / "evals").mkdir(parents=True)
    (runs / "metrics.jsonl").write_text('{"step": 1}\n')
    (runs / "evals" / "step_000010.parquet").write_bytes(bytes(range(256)))
    _git(tmp_path, "init", "-q", str(repo))
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@localhost", "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-q", "-m", "runs")
    entries = record(repo, "HEAD", ["results/runs"])
    assert entries[0]["files"] == 2 and entries[0]["bytes"] == 256 + len('{"step": 1}\n')
    _git(repo, "rm", "-q", "-r", "results/runs")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-q", "-m", "out of the tree")
    assert not (repo / "results" / "runs").exists()

    [folder] = fetch(repo, entries, tmp_path / "archive")
    assert (folder / "graft-s0" / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert (folder / "graft-s0" / "evals" / "step_000010.parquet").read_bytes() == bytes(range(256))

    with pytest.raises(ArchiveError, match="the manifest says"):
        fetch(repo, [{**entries[0], "tree": "0" * 40}], tmp_path / "other")
    with pytest.raises(ArchiveError, match="not in this clone"):
        fetch(repo, [{**entries[0], "commit": "1" * 40}], tmp_path / "other")
