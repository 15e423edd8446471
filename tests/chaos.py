"""Chaos: a seeded schedule of SIGKILLs at random moments of the demo pair's run
(``tests/reference_run.py``), and the check that the run ends as if nothing had happened.

A killer thread in the driver's process (``tests/chaos_kill.py``) waits for the controller to
enter a stage (``Controller.stage``: start-up, generate, verify, score, train, sync, evaluation,
checkpoint, upload, recovery, export), sleeps a random part of a second, and SIGKILLs one
process of a random kind: a trainer rank, a generation replica, a verifier actor, or a verifier
actor's math-verify child. These are real ``SIGKILL``s of the processes Ray started, as the OOM
killer or a lost node would deal them, not ``ray.kill``. Every answer goes to math-verify in a verifier
actor's child (``data.fast_path=false``, and :class:`ChaosController` has the actors judge
integers with math-verify too), so verifier actors and their children die at work. Checkpoints
are uploaded to ``run.storage``, so that the upload is a stage to die in.

A run is then compared with the uninterrupted reference run (``assert_same_run``: store,
evaluation files, summary, metrics, final weights), and every kill is matched with the death
the controller recorded for it (``summary.json``'s ``faults``): recovered (with its time to
recover), absorbed (a math-verify child: its actor starts another and judges the answer again),
or unnoticed (the actor was replaced before anything needed it, or the run ended first).

``python -m tests.chaos`` (``make chaos``): the reference run, then several schedules, each
compared with it, and tables of kills per run, stages covered and time to recover per stage.
``tests/test_chaos.py`` runs one short schedule in the suite.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import ray

from orchestrator.cluster.placement import VERIFIER_CPUS
from orchestrator.config import load_config
from orchestrator.controller.loop import Controller
from tests.chaos_kill import KINDS, TARGETS, Kill, Killed, Killer, deal, make_schedule
from tests.reference_run import DEMO, PAIR, assert_same_run, overrides
from workers.verify.verifier_pool import VerifierPool

__all__ = ["ChaosController", "ChaosResult", "Kill", "chaos_run", "main", "match", "tables"]

# settings of every chaos run beyond the reference's: two verifier actors, bounds that a run
# with a kill every few seconds does not reach (the defaults, 2 per step and 3 per actor in
# 600 s, are for real clusters), and checkpoints uploaded to run.storage
SETTINGS = ["data.verifier_actors=2", "run.max_step_retries=20", "run.max_restarts=20"]
# both models' weights over a gloo broadcast instead of the object store (the same weights, so
# the same run as the reference)
COLLECTIVE = ["models.0.generation.weight_sync=collective", "models.1.generation.weight_sync=collective"]


class StageClock:
    """A controller mixin: the seconds spent in each ``stage`` (``stage_s``) and how often it
    was entered (``stage_n``), from the stage's assignments."""

    def __setattr__(self, name: str, value) -> None:
        if name == "stage":
            now, d = time.perf_counter(), self.__dict__
            seconds, entered = d.setdefault("stage_s", {}), d.setdefault("stage_n", {})
            if "stage" in d:
                seconds[d["stage"]] = seconds.get(d["stage"], 0.0) + now - d["_stage_t"]
            if d.get("stage") != value:
                entered[value] = entered.get(value, 0) + 1
            d["_stage_t"] = now
        super().__setattr__(name, value)


class TimedController(StageClock, Controller):
    """The reference run, with the seconds it spent in each stage."""


class KillerAtItsSide:
    """A controller mixin: ``self.killer`` (a thread with ``start`` and ``halt``) starts with the
    run and halts when the run closes."""

    killer: Killer

    def run(self) -> dict:
        self.killer.start()
        return super().run()  # type: ignore[misc]

    def close(self, status: str) -> None:
        self.killer.halt()
        super().close(status)  # type: ignore[misc]


class ChaosController(KillerAtItsSide, StageClock, Controller):
    """A controller with a :class:`Killer` at its side from the start of the run to its end,
    and verifier actors that judge every boxed answer with math-verify in their children."""

    def __init__(self, config, plan: list[Kill]):
        super().__init__(config)
        self.killer = Killer(self, plan)

    def verifier_pool(self) -> VerifierPool:
        data = self.config.data
        return VerifierPool(data.verifier_actors, verifier=data.verifier, num_cpus_per_actor=VERIFIER_CPUS,
                            fast_path=data.fast_path, **self.config.verifier_params,
                            **({"settle_integers": False} if data.verifier == "math" else {}))


# -- one chaos run and its account ----------------------------------------------------------


def match(killed: list[Killed], faults: list[dict]) -> list[dict]:
    """Each kill with the death the controller recorded for it (the first one of the same
    actor noticed after the kill; a trainer rank's may be reported as its peer's); returns the
    deaths that no kill explains (none, in a run without other trouble)."""
    left = sorted(faults, key=lambda f: f["time"])
    for k in killed:
        if k.victim == "math-child":
            k.outcome = "absorbed"  # the actor starts another child and judges the answer again
            continue
        model = k.role.rsplit(" of model ", 1)[-1] if " of model " in k.role else None
        found = next((f for f in left if f["time"] >= k.time - 0.5 and f["actor"] == k.role), None)
        if found is None and k.victim == "trainer":
            found = next((f for f in left if f["time"] >= k.time - 0.5 and f["kind"] == "trainer"
                          and f["actor"].endswith(f" of model {model}")), None)
        if found is None:
            k.outcome = "unnoticed"
            continue
        left.remove(found)
        k.outcome = "recovered" if found.get("recovery_s") is not None else "noticed"
        k.noticed_in = found.get("stage", "")
        k.recovery_s = found.get("recovery_s")
        if k.recovery_s is not None:
            k.kill_to_recovered_s = round(found["time"] + k.recovery_s - k.time, 3)
    return left


@dataclass
class ChaosResult:
    name: str
    seed: int
    plan: list[Kill]
    killed: list[Killed] = field(default_factory=list)
    skipped: list[tuple[Kill, str]] = field(default_factory=list)
    faults: list[dict] = field(default_factory=list)
    unexplained: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    error: str = ""
    same: bool | None = None
    sync: str = "object_store"

    @property
    def recoveries(self) -> int:
        return sum(f.get("recovery_s") is not None for f in self.faults)

    def to_json(self) -> dict:
        return {"name": self.name, "seed": self.seed, "plan": [asdict(k) for k in self.plan],
                "killed": [asdict(k) for k in self.killed],
                "skipped": [[asdict(k), why] for k, why in self.skipped], "faults": self.faults,
                "unexplained": self.unexplained, "wall_s": self.wall_s, "error": self.error, "same": self.same,
                "sync": self.sync}


def chaos_run(out: Path, name: str, seed: int, plan: list[Kill], reference: Path | None = None,
              extra: list[str] | None = None) -> ChaosResult:
    """The reference's run under ``plan``, in ``out/name`` (checkpoints uploaded to
    ``out/storage/name``); compared with ``reference`` when given (``same``: it ended equal)."""
    sets = [*PAIR, *SETTINGS, f"run.storage={out / 'storage' / name}", *(extra or [])]
    ctrl = ChaosController(load_config(DEMO, overrides(out, name, sets)), plan)
    result = ChaosResult(name, seed, plan)
    t0 = time.monotonic()
    try:
        summary = ctrl.run()
        result.faults = summary["faults"]
    except Exception as exc:  # noqa: BLE001 - reported, and the caller fails
        result.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        state = getattr(ctrl, "state", None)  # none: the run stopped before its state was made
        result.faults = list(state.faults) if state is not None else []
    finally:
        ctrl.killer.halt()
    result.wall_s = round(time.monotonic() - t0, 1)
    result.killed, result.skipped = ctrl.killer.killed, ctrl.killer.skipped
    result.unexplained = match(result.killed, result.faults)
    if reference is not None and not result.error:
        try:
            assert_same_run(out / name, reference)
            result.same = True
        except AssertionError as exc:
            result.same = False
            result.error = f"differs from the reference: {str(exc)[:300]}"
    return result


# -- tables -------------------------------------------------------------------------------


def _stat(values: list[float]) -> str:
    return f"{statistics.median(values):6.1f} {max(values):6.1f}" if values else f"{'-':>6} {'-':>6}"


def tables(results: list[ChaosResult]) -> str:
    """Per run: kills, what became of them, stages covered, time, same as the reference; per
    stage (where the kill hit): kills, recovered, and the median and max time to recover, from
    the death noticed (``faults/recovery_s``) and from the kill itself."""
    lines = [f"{'run':<10} {'sync':<6} {'kills':>5} {'recov':>5} {'absorb':>6} {'unnot':>5} {'skip':>4} "
             f"{'wall s':>7}  {'same':<4}  stages hit"]
    for r in results:
        outcomes = [k.outcome for k in r.killed]
        lines.append(f"{r.name:<10} {r.sync[:6]:<6} {len(r.killed):>5} {outcomes.count('recovered'):>5} "
                     f"{outcomes.count('absorbed'):>6} {outcomes.count('unnoticed'):>5} {len(r.skipped):>4} "
                     f"{r.wall_s:>7.1f}  {'-' if r.same is None else 'yes' if r.same else 'NO':<4}  "
                     f"{', '.join(sorted({k.stage for k in r.killed}))}")
    killed = [k for r in results for k in r.killed]
    lines += ["", f"{'stage':<11} {'kills':>5} {'recov':>5} {'absorb':>6} {'unnot':>5}   "
                  f"{'noticed->recovered s':>20}   {'kill->recovered s':>17}", f"{'':<38}{'median    max':>20}"
                  f"   {'median    max':>17}"]
    for stage in [s for s in (*TARGETS, "route", "store") if any(k.stage == s for k in killed)]:
        ks = [k for k in killed if k.stage == stage]
        outcomes = [k.outcome for k in ks]
        rec = [k.recovery_s for k in ks if k.recovery_s is not None]
        total = [k.kill_to_recovered_s for k in ks if k.kill_to_recovered_s is not None]
        lines.append(f"{stage:<11} {len(ks):>5} {outcomes.count('recovered'):>5} {outcomes.count('absorbed'):>6} "
                     f"{outcomes.count('unnoticed'):>5}   {_stat(rec):>20}   {_stat(total):>17}")
    covered = {k.stage for k in killed}
    lines += ["", f"{len(killed)} kills in {len(results)} runs; stages covered: {len(covered & set(TARGETS))} of "
                  f"{len(TARGETS)}" + (f" (not: {', '.join(s for s in TARGETS if s not in covered)})"
                                       if set(TARGETS) - covered else "")
              + "; victims: " + ", ".join(f"{v} {sum(k.victim == v for k in killed)}" for v in KINDS)]
    for r in results:
        for kill, why in r.skipped:
            lines.append(f"{r.name}: skipped a {kill.victim} kill at {kill.stage}: {why}")
        for f in r.unexplained:
            lines.append(f"{r.name}: a death no kill explains: {f['actor']} at step {f['step']} ({f['stage']})")
        if r.error:
            lines.append(f"{r.name}: {r.error}")
    return "\n".join(lines)


def overhead(ctrl: StageClock, steps: int) -> str:
    """What fault tolerance costs a run without faults: the checkpoint writes (every step here)
    against the steps' own time."""
    s, n = ctrl.stage_s, ctrl.stage_n
    step_s = sum(s.get(k, 0.0) for k in ("generate", "verify", "score", "route", "train", "sync", "store")) / steps
    write = s.get("checkpoint", 0.0) / max(n.get("checkpoint", 1), 1)
    return (f"reference run (no faults): {steps} steps of {step_s:.2f} s (generate .. store), "
            f"{n.get('checkpoint', 0)} checkpoints of {write:.2f} s each (step 0 included): "
            f"{write / step_s:.0%} of a step with run.checkpoint_every = 1")


def _storm(args: argparse.Namespace, reference: Path) -> int:
    """``--every``: one run under :class:`tests.chaos_storm.IntervalKiller`, its account in
    ``storm.txt`` and ``storm.json``."""
    from tests.chaos_storm import storm_run

    result = storm_run(args.out, "storm", args.every, args.kills, args.seed, reference)
    text = result.text()
    print("\n" + text, flush=True)
    (args.out / "storm.txt").write_text(text + "\n")
    (args.out / "storm.json").write_text(json.dumps(
        {"every_s": result.every_s, "kills": [asdict(k) for k in result.kills], "missed": result.missed,
         "restarts": result.restarts, "steps": result.steps, "wall_s": result.wall_s, "same": result.same,
         "error": result.error}, indent=1))
    return 0 if result.same else 1


def main(argv: list[str] | None = None) -> int:
    from orchestrator.cluster.local_ray import local_ray_init_kwargs
    from tests.reference_run import run_reference

    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/chaos"))
    parser.add_argument("--schedules", type=int, default=5)
    parser.add_argument("--kills", type=int, default=6, help="kills per schedule")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--collective", type=int, default=1,
                        help="the last N schedules sync weights over a collective group (generation.weight_sync)")
    parser.add_argument("--every", type=float, default=0.0,
                        help="from-start-up mode (tests/chaos_storm.py): a random trainer rank or generation replica "
                             "SIGKILLed every EVERY s from the job's start, --kills times (0: until the run ends)")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    for old in [args.out / "ref", args.out / "storage", args.out / "storm", *args.out.glob("chaos-*")]:  # an earlier make chaos
        shutil.rmtree(old, ignore_errors=True)
    ray.init(**local_ray_init_kwargs(num_cpus=8))
    try:
        t0 = time.monotonic()
        made: list[TimedController] = []
        reference = run_reference(args.out, lambda config: made.append(TimedController(config)) or made[-1])
        cost = overhead(made[0], len(made[0].state.history))
        print(f"reference run: {time.monotonic() - t0:.1f} s; {cost}", flush=True)
        if args.every:
            return _storm(args, reference)
        results = []
        for i, stages in enumerate(deal(args.seed, args.schedules, args.kills)):
            seed = args.seed * 1000 + i
            plan = make_schedule(seed, stages)
            extra = COLLECTIVE if i >= args.schedules - args.collective else []
            print(f"chaos-{i}{' (collective weight sync)' if extra else ''}: "
                  + ", ".join(f"{k.victim}@{k.stage}" for k in plan), flush=True)
            result = chaos_run(args.out, f"chaos-{i}", seed, plan, reference, extra)
            result.sync = "collective" if extra else "object_store"
            results.append(result)
            print(f"chaos-{i}: {len(result.killed)} kills, {result.recoveries} recoveries, {result.wall_s:.1f} s, "
                  f"{'same as the reference' if result.same else result.error}", flush=True)
    finally:
        ray.shutdown()
    text = tables(results) + "\n" + cost
    print("\n" + text)
    (args.out / "chaos.json").write_text(json.dumps([r.to_json() for r in results], indent=1))
    (args.out / "chaos.txt").write_text(text + "\n")
    ok = all(r.same and not r.error for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
