"""A wheelhouse checked the way a node with no network uses it (``make wheelhouse-check``).

1. A fresh venv of the node's Python, given what the node has before GraftPool arrives: torch
   (``--torch``, from wherever this machine's pip finds it) and the ``--preinstalled`` pins.
2. In a network namespace of its own (``unshare --net``: loopback only, nothing else reachable),
   the wheelhouse unpacked and its ``install.sh`` run (``pip install --no-index``), then the
   installed package (not this checkout: the run starts in an empty folder) runs the demo pair's
   first step with a local Ray instance, its store and summary checked.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STEP = """
import json, sys
import orchestrator
from orchestrator.config import load_config
from orchestrator.controller.loop import train
config = load_config(sys.argv[1], ["run.steps=1", "run.eval_every=0", "run.name=offline", f"run.output_dir={sys.argv[2]}",
                                   "algorithm.prompt_batch=8", "data.verifier_actors=1"])
summary = train(config)
print(json.dumps({"steps": summary["steps"], "models": sorted(summary["models"]), "package": orchestrator.__file__}))
"""


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    print("+ " + " ".join(command), flush=True)
    done = subprocess.run(command, **kwargs)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(command)}\n{(done.stdout or '')[-3000:]}"
                         f"{(done.stderr or '')[-6000:]}")
    return done


def offline(command: str) -> list[str]:
    """``command`` (a shell line) in a new network namespace with only loopback, up."""
    return ["unshare", "--net", "--", "sh", "-c", f"ip link set lo up && {command}"]


def check(python: str, wheelhouse: Path, torch: str, preinstalled: list[str], work: Path) -> dict:
    venv = work / "venv"
    run([python, "-m", "venv", str(venv)])
    vpy = str(venv / "bin" / "python")
    run([vpy, "-m", "pip", "install", "--quiet", torch, *preinstalled])  # what the site installed
    with tarfile.open(wheelhouse) as archive:
        archive.extractall(work, filter="data")
    folder = next(p for p in work.iterdir() if p.name.startswith("wheelhouse-py"))
    run(offline(f"PYTHON={vpy} sh {folder / 'install.sh'} --quiet"))
    empty = work / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV"))}
    env["GRAFTPOOL_CACHE"] = str(Path(os.environ.get("GRAFTPOOL_CACHE") or ROOT / ".cache").resolve())
    script = empty / "step.py"
    script.write_text(STEP)
    done = run(offline(f"cd {empty} && {vpy} {script} {ROOT / 'configs' / 'demo_pair.yaml'} {work / 'runs'}"),
               env=env, capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    rows = sorted((work / "runs" / "offline" / "trajectories").glob("step_*.parquet"))
    return {**result, "store_files": len(rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}")
    parser.add_argument("--wheelhouse", type=Path, required=True)
    parser.add_argument("--torch", default="torch", help="the torch requirement the node has")
    parser.add_argument("preinstalled", nargs="*", help="other name==version the node has")
    args = parser.parse_args(argv)
    python = shutil.which(f"python{args.python}") or sys.executable
    with tempfile.TemporaryDirectory(prefix="gp-offline-") as tmp:
        result = check(python, args.wheelhouse.resolve(), args.torch, args.preinstalled, Path(tmp))
    ok = result["steps"] == 1 and result["store_files"] == 1 and "site-packages" in result["package"]
    print(json.dumps(result))
    print("offline install and first step: " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
