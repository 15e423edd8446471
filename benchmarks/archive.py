"""Raw benchmark run data, out of the working tree and back (``make bench-archive``).

The learning benchmark's committed results keep, per run, what a report and a reader need:
``config.yaml``, ``summary.json`` and the small digests (``run_digest.json``,
``store_summary.json``) beside the tables, plots and READMEs. The raw files of the runs of
earlier sittings (per-step ``metrics.jsonl``, evaluation responses, flow matrices, trajectory
stores; ~145 MB) were committed once and then removed from the tree; nothing was rewritten:
they stay in the repository's history, and ``archive.json`` (beside this module's results)
names, per folder, the commit that holds it and its git tree id: a SHA-1 over every file's path
and content, so a fetched copy is checked against it before it is unpacked.

``python -m benchmarks.archive fetch`` (``make bench-archive``) unpacks each archived folder from
the local repository into ``benchmarks/results/archive/<folder>/`` (git-ignored), with no network:
a clone has the history. A shallow clone does not; the command then says how to deepen it.
``python -m benchmarks.archive record <commit> <folder>...`` writes the entries.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MANIFEST = RESULTS / "archive.json"
DEST = RESULTS / "archive"


class ArchiveError(RuntimeError):
    """An archived folder that cannot be fetched, with why and what to do."""


def _git(repo: Path, *args: str, binary: bool = False):
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
    if done.returncode != 0:
        raise ArchiveError(f"git {' '.join(args)}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout if binary else done.stdout.decode().strip()


def record(repo: Path, commit: str, folders: list[str]) -> list[dict]:
    """One manifest entry per folder (a path relative to the repository) as it is at ``commit``:
    the full commit id, the folder's tree id, its file count and bytes."""
    full = _git(repo, "rev-parse", f"{commit}^{{commit}}")
    out = []
    for folder in folders:
        tree = _git(repo, "rev-parse", f"{full}:{folder}")
        sizes = [int(line.split()[3]) for line in _git(repo, "ls-tree", "-r", "-l", tree).splitlines()]
        out.append({"path": folder, "commit": full, "tree": tree, "files": len(sizes), "bytes": sum(sizes)})
    return out


def fetch(repo: Path, entries: list[dict], dest: Path) -> list[Path]:
    """Unpack each entry's folder from ``repo``'s history into ``dest/<its path under
    benchmarks/results>`` after
    checking that its commit holds it with the recorded tree id. Returns the folders written."""
    written = []
    for entry in entries:
        try:
            _git(repo, "cat-file", "-e", f"{entry['commit']}^{{commit}}")
        except ArchiveError:
            raise ArchiveError(f"{entry['path']}: commit {entry['commit'][:12]} is not in this clone (a shallow "
                               "clone?): run `git fetch --unshallow`, then again") from None
        tree = _git(repo, "rev-parse", f"{entry['commit']}:{entry['path']}")
        if tree != entry["tree"]:
            raise ArchiveError(f"{entry['path']}: commit {entry['commit'][:12]} holds tree {tree[:12]}, the manifest "
                               f"says {entry['tree'][:12]}")
        target = dest / entry["path"].removeprefix("benchmarks/results/")
        tar = _git(repo, "archive", "--format=tar", entry["tree"], binary=True)
        with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
            members = [m for m in archive.getmembers() if m.isfile()]
            if len(members) != entry["files"]:
                raise ArchiveError(f"{entry['path']}: {len(members)} files unpacked, the manifest says {entry['files']}")
            target.mkdir(parents=True, exist_ok=True)
            archive.extractall(target, members=members, filter="data")
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    get = sub.add_parser("fetch", help="unpack every archived folder into benchmarks/results/archive/")
    get.add_argument("--only", nargs="*", default=None,
                     help="results folders to fetch, e.g. learning_pair_28_amx (default: all)")
    rec = sub.add_parser("record", help="add folders as they are at a commit to the manifest")
    rec.add_argument("commit")
    rec.add_argument("folders", nargs="+")
    args = parser.parse_args(argv)
    entries = json.loads(MANIFEST.read_text())["folders"] if MANIFEST.is_file() else []
    if args.command == "record":
        new = record(ROOT, args.commit, args.folders)
        kept = [e for e in entries if e["path"] not in {n["path"] for n in new}]
        MANIFEST.write_text(json.dumps({"about": __doc__.split("\n\n")[1].replace("\n", " "),
                                        "folders": kept + new}, indent=1) + "\n")
        for e in new:
            print(f"{e['path']}: {e['files']} files, {e['bytes'] / 2**20:.1f} MiB at {e['commit'][:12]}")
        return 0
    chosen = [e for e in entries if args.only is None or any(e["path"].startswith(f"benchmarks/results/{name}")
                                                             for name in args.only)]
    try:
        for folder in fetch(ROOT, chosen, DEST):
            print(f"{folder.relative_to(ROOT)}: unpacked", flush=True)
    except ArchiveError as exc:
        print(f"bench-archive: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
