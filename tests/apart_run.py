"""The demo pair with actors that do not share the driver's disk, on one machine, for
``tests/test_storage.py``; run as a script so that its Ray instance (with a job-wide
``working_dir``) never meets the test session's.

Ray starts every actor of the job in its own copy of ``working_dir``, as a ``ray job submit``
job on a cluster without a shared disk does, while the driver works in OUT/head; the run folder
is relative (``run.output_dir=runs``), so the driver's ``runs/<name>`` and the actors'
``runs/<name>`` are different folders, as they are on two machines.

1. ``split``: ``run.storage=store``, a plain path that each process resolves in its own working
   folder (on a cluster: a path mounted on the head alone), must fail before step 0. One model
   (llama-char, no exchange): the check is each trainer rank's, and a rank of either model names
   it alike, so gpt2-bpe's replica and two ranks would only add their start-up.
2. ``apart``: the reference run's settings (``tests/reference_run.py``), stopped right after its
   step-2 checkpoint, then resumed with ``run.resume`` in a new controller; in the resumed run
   trainer rank 1 of gpt2-bpe is killed during step 3's update, so the run goes back to the
   checkpoint of step 2 once more.

Writes ``result.json`` in OUT: the driver's and the actors' working folders, the ``split``
error and what its run folder holds, the resumed run's faults.

``python -m tests.apart_run OUT``
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml

from orchestrator.cluster.local_ray import local_ray_init_kwargs

RUNS = Path("runs")  # relative: the driver's and the actors' own working folders
STOP_AFTER = 2


def _cwd() -> str:
    return os.getcwd()


class Stopped(Exception):
    """The first job ends here, its step-``STOP_AFTER`` checkpoint written."""


def main(out: Path) -> int:
    import ray

    from orchestrator.config import load_config
    from orchestrator.controller.loop import Controller
    from tests.reference_run import DEMO, overrides
    from tests.test_faults import FaultyController

    class StopAfter(Controller):
        def checkpoint(self, step: int) -> Path:
            folder = super().checkpoint(step)
            if step == STOP_AFTER:
                raise Stopped(step)
            return folder

    head, copy = out / "head", out / "actors-copy"
    head.mkdir(parents=True)
    copy.mkdir()
    (copy / "README").write_text("what Ray uploads as every actor's working folder\n")
    os.chdir(head)
    ray.init(**local_ray_init_kwargs(num_cpus=8, runtime_env={"working_dir": str(copy)}), log_to_driver=False)
    result: dict = {"driver_cwd": os.getcwd(), "actor_cwd": ray.get(ray.remote(_cwd).remote())}
    one = yaml.safe_load(DEMO.read_text())
    one["models"], one["exchange"] = one["models"][:1], {"name": "none"}
    try:
        Controller(load_config(data=one, overrides=[*overrides(RUNS, "split", []), "run.storage=store"])).run()
        result["split_error"] = None
    except Exception as exc:  # noqa: BLE001 - what it fails with is the test's to judge
        result["split_error"] = f"{type(exc).__name__}: {exc}"
    result["split_files"] = sorted(str(p) for p in (RUNS / "split").rglob("*") if p.is_file()
                                   and ("checkpoints" in p.parts or "trajectories" in p.parts))

    try:
        StopAfter(load_config(DEMO, overrides(RUNS, "apart"))).run()
    except Stopped:
        pass
    result["stopped_at"] = sorted(p.name for p in (RUNS / "apart" / "checkpoints").glob("step_*"))
    resumed = FaultyController(load_config(DEMO, [*overrides(RUNS, "apart"), "run.resume=true"]), {},
                               train_kill=("gpt2-bpe", 1, STOP_AFTER + 1))
    result["summary"] = resumed.run()
    result["actor_files"] = sorted(str(p.relative_to(result["actor_cwd"]))
                                   for p in Path(result["actor_cwd"]).rglob("*") if p.is_file())
    ray.shutdown()
    (out / "result.json").write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve()))
