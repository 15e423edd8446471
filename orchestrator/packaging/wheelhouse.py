"""An offline wheelhouse for a node with no network (``make wheelhouse``).

``python -m orchestrator.packaging.wheelhouse --python 3.12 --preinstalled torch==2.11.0 ...``:

1. the project's own wheel, and DeepSpeed's (PyPI has only its sdist: built here as a
   pure-Python wheel with ``DS_BUILD_OPS=0``, its CUDA ops compiled just in time on the node);
2. the run-time requirements (``pyproject.toml``'s dependencies and the extras asked for, with
   ``mlflow`` as ``mlflow-skinny`` + SQLAlchemy + Alembic: what writing the run's sqlite store
   needs; the MLflow UI runs wherever the store is read) resolved by pip for the target's Python
   and platform, against what the node has (``--preinstalled`` pins, ``--freeze`` a ``pip
   freeze`` of it: given to pip as empty stub wheels of those versions) and downloaded as wheels
   for that target, less what the node has (``orchestrator.packaging.resolve``); ``--with-peers`` adds TRL and datasets (the step
   benchmark's peer side);
3. Ray slimmed (no Java jars, RLlib or web client; ``--no-slim-ray``) and its binaries stripped
   (``--no-strip``), ``orchestrator.packaging.wheels``;
4. ``requirements.txt`` (every bundled package pinned), ``install.sh`` (``pip install
   --no-index`` from the folder: no index, no network), ``manifest.json`` (each wheel's sha256),
   all in one ``.tar`` with its ``.sha256`` (``--part-mib``: parts of bounded size instead).

On the node: ``for t in graftpool-wheelhouse-py312*.tar; do tar xf "$t"; done && sh wheelhouse-py312/install.sh`` (every part).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from orchestrator.packaging.resolve import Target, closure, parse_pins
from orchestrator.packaging.wheels import slim, strip_binaries, stub_wheel

ROOT = Path(__file__).resolve().parents[2]
SUBSTITUTES = {"mlflow": ["mlflow-skinny{spec}", "sqlalchemy>=2", "alembic"]}
"""A requirement replaced in the bundle by what the node needs of it."""
PEERS = ["trl==1.16.0", "datasets"]
STRIPPED = ("ray",)
"""Wheels whose binaries are stripped (``orchestrator.packaging.wheels.strip_binaries``): Ray's
carry most of the symbols; auditwheel-repaired ones elsewhere may not survive it."""

INSTALL_SH = """#!/bin/sh
# Installs GraftPool and what it needs from this folder alone: no index, no network.
# PYTHON=/path/to/python sh install.sh  (default: python3); extra pip options may follow.
# requirements.txt pins what the node lacks; GraftPool itself goes in without its declared
# requirements, whose MLflow is the whole server package where the bundle has mlflow-skinny.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
"$python" -m pip install --no-index --find-links "$here/wheels" -r "$here/requirements.txt" "$@"
"$python" -m pip install --no-index --find-links "$here/wheels" --no-deps "$@" {project}
"$python" -m pip check || echo "install.sh: pip check lists the requirements above (mlflow: the bundle has mlflow-skinny)"
"""


def run(command: list[str], **kwargs) -> None:
    print("+ " + " ".join(command), flush=True)
    subprocess.run(command, check=True, **kwargs)


def roots(extras: list[str], with_peers: bool) -> list[str]:
    """The bundle's root requirements: the project's (``pyproject.toml``) with substitutes."""
    from graftpool.requirements import requirements

    out = []
    for text in requirements(extras, ROOT / "pyproject.toml"):
        req = Requirement(text)
        name = canonicalize_name(req.name)
        out += [s.format(spec=req.specifier) for s in SUBSTITUTES[name]] if name in SUBSTITUTES else [text]
    return out + (PEERS if with_peers else [])


def build_deepspeed(spec: str, work: Path, pip: list[str]) -> Path:
    """DeepSpeed's sdist built into a pure-Python wheel (``DS_BUILD_OPS=0``: ops compiled just in
    time where they run); needs torch importable here."""
    sdists, wheels = work / "sdist", work / "local"
    run([*pip, "download", "--no-deps", "--no-binary=:all:", "-d", str(sdists), spec])
    sdist = next(sdists.glob("deepspeed-*"))
    env = {**os.environ, "DS_BUILD_OPS": "0", "DS_BUILD_AIO": "0", "DS_BUILD_SPARSE_ATTN": "0"}
    run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(sdist)], env=env)
    return next(wheels.glob("deepspeed-*.whl"))


def resolve(requirements: list[str], target: Target, work: Path, pip: list[str], find_links: Path) -> dict[str, str]:
    """pip's resolution for the target, less what the node has: name -> version. What the node has
    is given to pip as empty stub wheels of those versions (direct references), so the rest is
    resolved against them and nothing of theirs is looked up (torch's CUDA wheels, say). ``work``
    may be relative (``make wheelhouse`` passes ``--out dist``): a file URI needs an absolute path."""
    stubs = [f"{name} @ {stub_wheel(work / 'stubs', name, version).absolute().as_uri()}"
             for name, version in target.preinstalled.items() if version is not None]
    report = work / "report.json"
    run([*pip, "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
         "--target", str(work / "unused"), "--find-links", str(find_links), *target.pip_args(), *requirements, *stubs])
    return closure(requirements, json.loads(report.read_text())["install"], target)


def build(target: Target, extras: list[str], out: Path, pip: list[str], slim_ray: bool = True,
          strip: bool = True, with_peers: bool = False, also: list[str] | None = None,
          part_mib: float | None = None) -> Path:
    """The wheelhouse folder and its ``.tar`` (see the module docstring); returns the tar."""
    folder = out / f"wheelhouse-py{target.python.replace('.', '')}"
    shutil.rmtree(folder, ignore_errors=True)
    wheels, work = folder / "wheels", out / f".work-py{target.python}"
    shutil.rmtree(work, ignore_errors=True)
    wheels.mkdir(parents=True)
    work.mkdir(parents=True)
    local = work / "local"
    run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(local), str(ROOT)])
    requirements = roots(extras, with_peers) + list(also or [])
    for i, text in enumerate(requirements):
        if canonicalize_name(Requirement(text).name) == "deepspeed":
            built = build_deepspeed(text, work, pip)
            requirements[i] = f"deepspeed=={parse_wheel_filename(built.name)[1]}"
    project = next(local.glob("graftpool-*.whl"))
    pins = resolve(requirements, target, work, pip, local)
    remote = {n: v for n, v in pins.items() if not any(parse_wheel_filename(w.name)[0] == n for w in local.glob("*.whl"))}
    if remote:
        run([*pip, "download", "--no-deps", "--quiet", "-d", str(wheels), *target.pip_args(),
             *(f"{n}=={v}" for n, v in remote.items())])
    for wheel in local.glob("*.whl"):
        shutil.copy(wheel, wheels / wheel.name)
    for wheel in sorted(wheels.glob("*.whl")):
        name = parse_wheel_filename(wheel.name)[0]
        if slim_ray and name == "ray":
            print(f"{wheel.name}: {slim(wheel)} files left out (jars, rllib, dashboard web client)", flush=True)
        if strip and name in STRIPPED:
            changed = strip_binaries(wheel)
            if changed:
                print(f"{wheel.name}: {changed} binaries stripped", flush=True)
    project_name, project_version = parse_wheel_filename(project.name)[:2]
    (folder / "requirements.txt").write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
    (folder / "install.sh").write_text(INSTALL_SH.replace("{project}", f"{project_name}=={project_version}"))
    (folder / "install.sh").chmod(0o755)
    manifest = {"python": target.python, "platforms": list(target.platforms), "preinstalled": dict(target.preinstalled),
                "wheels": {w.name: {"sha256": hashlib.sha256(w.read_bytes()).hexdigest(), "bytes": w.stat().st_size}
                           for w in sorted(wheels.glob("*.whl"))}}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    tars = pack(folder, out, part_mib)
    shutil.rmtree(work, ignore_errors=True)
    size = sum(v["bytes"] for v in manifest["wheels"].values())
    print(f"{', '.join(map(str, tars))}: {len(manifest['wheels'])} wheels, {size / 2**20:.1f} MiB", flush=True)
    return tars[0]


def pack(folder: Path, out: Path, part_mib: float | None = None) -> list[Path]:
    """``folder`` as one tar (with its ``.sha256``), or with ``part_mib`` as parts of at most that
    many MiB of wheels each (``.part1.tar``, ...; part 1 holds the scripts; unpack every part in
    one place): what a transfer of bounded size carries."""
    wheels = sorted(folder.glob("wheels/*.whl"), key=lambda w: -w.stat().st_size)
    parts: list[list[Path]] = [[]]
    if part_mib is None:
        parts = [wheels]
    else:
        sizes: list[int] = [0]
        for wheel in wheels:  # first fit, largest first
            size = wheel.stat().st_size
            if size > part_mib * 2**20:
                raise ValueError(f"--part-mib {part_mib}: {wheel.name} alone is {size / 2**20:.1f} MiB")
            slot = next((i for i, used in enumerate(sizes) if used + size <= part_mib * 2**20), None)
            if slot is None:
                parts.append([])
                sizes.append(0)
                slot = len(parts) - 1
            parts[slot].append(wheel)
            sizes[slot] += size
    names = [f"graftpool-{folder.name}.tar"] if len(parts) == 1 else \
        [f"graftpool-{folder.name}.part{i + 1}.tar" for i in range(len(parts))]
    tars = []
    for i, (name, part) in enumerate(zip(names, parts, strict=True)):
        tar = out / name
        with tarfile.open(tar, "w") as archive:
            if i == 0:
                for item in sorted(folder.iterdir()):
                    if item.name != "wheels":
                        archive.add(item, arcname=f"{folder.name}/{item.name}")
            for wheel in part:
                archive.add(wheel, arcname=f"{folder.name}/wheels/{wheel.name}")
        (out / f"{tar.name}.sha256").write_text(f"{hashlib.sha256(tar.read_bytes()).hexdigest()}  {tar.name}\n")
        tars.append(tar)
    return tars


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                        help="the node's Python, e.g. 3.12 (default: this one)")
    parser.add_argument("--platform", action="append", default=None,
                        help="pip platform tag(s) of the node (default: manylinux x86_64)")
    parser.add_argument("--preinstalled", nargs="*", default=[],
                        help="name==version the node has (e.g. torch==2.11.0), or a bare name: some version")
    parser.add_argument("--freeze", type=Path, default=None,
                        help="a `pip freeze` of the node (everything it has), or a list of names, one a line")
    parser.add_argument("--extras", default="deepspeed", help="the project's extras to bundle, comma-separated")
    parser.add_argument("--with-peers", action="store_true", help="also TRL and datasets (the step benchmark's peer)")
    parser.add_argument("--also", nargs="*", default=[], help="more requirements to bundle (e.g. pytest)")
    parser.add_argument("--part-mib", type=float, default=None,
                        help="write parts of at most this many MiB of wheels (a transfer of bounded size)")
    parser.add_argument("--no-slim-ray", dest="slim_ray", action="store_false")
    parser.add_argument("--no-strip", dest="strip", action="store_false")
    parser.add_argument("--out", type=Path, default=ROOT / "dist")
    args = parser.parse_args(argv)
    preinstalled = parse_pins(args.freeze.read_text().splitlines()) if args.freeze else {}
    preinstalled |= parse_pins(args.preinstalled)
    target = Target(args.python, tuple(args.platform) if args.platform else Target.platforms, preinstalled)
    extras = [e for e in args.extras.split(",") if e]
    build(target, extras, args.out, [sys.executable, "-m", "pip", "--disable-pip-version-check"], args.slim_ray,
          args.strip, args.with_peers, args.also, args.part_mib)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
