"""How ``make test`` splits each suite (the main one, then the scale backends') between two
pytest-xdist workers (``-n 2 --dist loadscope``, with :class:`SharedRunScheduling` in place of
xdist's module grouping).

A unit of work goes to one worker whole. The tests of a module share its module-scoped fixtures
(a pair run, a live MLflow server, a built model), so by default a module is one unit, as in
xdist's ``loadscope``. Two modules hold end-to-end runs that need no fixture of their module:
those tests are units of their own, so that the two longest modules do not land on one worker.
The modules that compare runs with the demo pair's reference run (the session fixture
``demo_reference``, one per worker) are one unit (:data:`SHARES_REFERENCE`), so that it is run once.
Units start heaviest first (longest-processing-time scheduling), from the seconds one fresh-clone
run took on 2 cores (``--durations``); a unit not listed starts after them, in collection order.

Why two workers: the suite is mostly CPU-bound, but about a fifth of its CPU time was idle on 2
cores (single-threaded tests, processes starting, servers waiting), and a second worker fills it.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

# Tests that use no fixture of their module beyond the session's Ray instance: one unit each.
INDEPENDENT = {
    "tests/test_faults.py": ("test_deaths_past_the_retry_bound", "test_a_dead_trainer_without_checkpoints"),
    "tests/test_platform.py": ("test_three_model_pool", "test_graft_ablations_reach_the_store",
                               "test_hacpo_pair_run"),
}

# Modules whose tests compare with the demo pair's reference run (``demo_reference``, one per
# worker process): they join test_faults.py's unit, so that the reference is run once.
SHARES_REFERENCE = {
    "tests/test_startup_faults.py": "tests/test_faults.py",
    "tests/test_chaos.py": "tests/test_faults.py",
    "tests/test_restart_one.py": "tests/test_faults.py",
    # the demo pair with every actor in a working folder of its own (no shared disk), stopped,
    # resumed and a rank killed, against the reference (about 200 s under load)
    "tests/test_storage.py": "tests/test_faults.py",
}

# Modules that read another module's session run (``graft_pair_run``, tests/shared_runs.py) join
# its unit, so that the run is made once.
SHARES_RUN = {
    "tests/test_gate_kinds.py": "tests/test_routing_transfer.py",
    "tests/test_gate_split.py": "tests/test_routing_transfer.py",
}

# Seconds per unit (module, or test for the ones above) in one fresh-clone run on 2 cores.
SECONDS = {
    # the demo reference run, a SIGKILLed driver, lost nodes, killed actors; with
    # test_startup_faults.py (SHARES_REFERENCE): actors killed in __init__ and during a recovery;
    # with test_chaos.py: a five-kill chaos run (about 60 s more, not yet timed on an idle machine);
    # with test_restart_one.py: two demo runs, actors killed at start-up and a trainer without
    # checkpoints; with test_storage.py: a Ray instance of its own and three runs. On a quiet
    # machine (2026-12-05): reference 54 s, storage 157, chaos 86, killed actors 76, SIGKILLed
    # driver 75, lost node 65, startup faults 55 + 45, restart_one about 90, small ones about 20
    "tests/test_faults.py": 650,
    # not yet timed on an idle machine: a 2-step bf16-mixed pair run and a 1 + 1 step resume of it
    # (16 prompts), like the pair run of test_platform.py; 406 s with other suites running beside it
    "tests/test_precision.py": 130,
    # the same shape as test_precision.py (a 2-step pair run, a 1-step resume of a copy of it, 16
    # prompts), with LoRA on one model; not yet timed on an idle machine: 404 s at a load average of
    # 22-27 on 2 cores, before the resume's own 1-step run was dropped (40 s of 67 alone, 2026-12-06)
    "tests/test_lora.py": 95,
    "tests/test_platform.py": 110,  # the pair run, a stored-peer run, serve and eval
    # run.async one_step: the demo reference, a stop and resume, a five-kill chaos run, and a
    # two-replica reference and chaos run: 28 s setup + 86 + 50 + about 65 quietly (2026-12-05)
    "tests/test_async.py": 240,
    # six 2-step pair runs (three presets, each spelled out two ways) and a 3-model pool run:
    # 69 + 59 + 53 s for the pairs under load (2026-12-06, a 1527 s suite), about 120 s quietly;
    # 77 + 56 + 54 + 42 s in a 1342 s fresh-clone run, where test_faults.py's unit took about 1.2
    # times its figure here. With test_gate_kinds.py (SHARES_RUN): three more 2-step pair runs (its
    # fourth is the graft preset's), 127 s for four in that run
    "tests/test_routing_transfer.py": 270,
    # a 1-step pair run in a process with its own Ray instance: 76 s quietly (2026-12-05)
    "tests/test_hub_models.py": 85,
    "tests/test_dashboards_live.py": 77,
    "tests/test_job_submit.py": 40,  # the resume job 62 s quietly (2026-12-05), 40 s in the 1342 s run
    # not yet timed on an idle machine: an autoscaling cluster (a head and a worker node the
    # autoscaler adds), a demo-pair job through ray job submit, two failed starts; 80-143 s under load
    "tests/test_autoscaling.py": 80,
    # an autoscaling cluster whose autoscaler adds a GPU worker, serve deployed there; 80 s, the same CI
    "tests/test_serve_autoscaling.py": 80,
    # two 2-step demo runs with a test-registered mode; 63 s, the same CI; 41 s in the 1342 s run
    "tests/test_weight_sync_modes.py": 40,
    # its GRAFT step 52 s quietly (2026-12-05), 100 s in the 1342 s fresh-clone run (about 85 on this
    # scale); 15 s of it were SmolLM2's step snapshots, no longer taken
    "tests/test_real_model.py": 70,
    # not yet timed on an idle machine: reasoning-gym's import (4 s idle, 25 s under load), a
    # 2-step pair run with two small warm starts, 384 answers scored; 110 s at load average 16
    # (the warm starts built), 134-271 s at load average 15-37
    "tests/test_reasoning_gym.py": 60,
    "tests/test_model_zoo.py": 48,
    "tests/test_verifier.py": 32,
    "tests/test_platform.py::test_three_model_pool": 25,
    "tests/test_weight_sync.py": 22,
    "tests/test_workers.py": 21,
    "tests/test_platform.py::test_hacpo_pair_run": 18,
    "tests/test_platform.py::test_graft_ablations_reach_the_store": 17,
    "tests/test_faults.py::test_deaths_past_the_retry_bound": 11,
    "tests/test_dashboards.py": 4,
    "tests/test_dashboards_store.py": 7,
    "tests/test_redaction.py": 10,
    "tests/test_logprobs.py": 9,
    "tests/test_faults.py::test_a_dead_trainer_without_checkpoints": 7,
    # the scale suite (.venv-scale), one process, warm: its modules spread over the workers
    "tests/test_scale_backends.py": 60,  # three vLLM engines (one with LoRA), the mixed folder test
    "tests/test_scale_deepspeed.py": 50,  # the DeepSpeed trainings
    "tests/test_scale_pool.py": 89,  # the mixed pool's run and its fault run
}


def unit_of(nodeid: str) -> str:
    """The unit a test belongs to: its module (or the module whose run it shares,
    :data:`SHARES_REFERENCE`, :data:`SHARES_RUN`), or the test itself for :data:`INDEPENDENT` ones."""
    module, _, name = nodeid.partition("::")
    if name.startswith(INDEPENDENT.get(module, ())):
        return nodeid
    return SHARES_REFERENCE.get(module) or SHARES_RUN.get(module, module)


def weight_of(unit: str) -> float:
    """Seconds a unit took (:data:`SECONDS`, by module or test name without parameters); 0 unknown."""
    module, _, name = unit.partition("::")
    for key, seconds in SECONDS.items():
        key_module, _, key_name = key.partition("::")
        if key_module == module and (name.startswith(key_name) if key_name else not name):
            return seconds
    return 0.0


class SharedRunScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with :func:`unit_of` as the scope, heaviest units first."""

    def __init__(self, config, log=None) -> None:  # noqa: ANN001 - xdist's Config and Producer
        super().__init__(config, log)
        self._ordered = False  # xdist fills the queue in schedule(), then assigns from it

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)

    def _assign_work_unit(self, node) -> None:  # noqa: ANN001 - xdist's WorkerController
        if not self._ordered:
            units = sorted(self.workqueue.items(), key=lambda item: -weight_of(item[0]))  # stable
            self.workqueue.clear()
            self.workqueue.update(units)
            self._ordered = True
        super()._assign_work_unit(node)
