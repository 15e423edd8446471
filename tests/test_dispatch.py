"""The dispatch layer (workers/dispatch.py, orchestrator/cluster/actor_calls.py): every public worker
method declares a mode of its role, every mode is carried out as declared on real Ray actors,
methods are named by reference (a string, a misspelt or undeclared method, another role's method or
wrong arguments fail at the call), and no driver-side code calls a replica or a trainer rank
directly (issue #54)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from graftpool.step_record import StepRecord
from orchestrator.cluster.actor_calls import MODES, call
from orchestrator.cluster.model_actors import ModelActors
from workers.dispatch import RANK_MODES, REPLICA_MODES, Dispatch, dispatch
from workers.rollout.generation import GenerationWorker
from workers.training.trainer import TorchTrainer

ROOT = Path(__file__).resolve().parent.parent


def public_methods(cls: type) -> list[str]:
    return [name for name, _ in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_") and not isinstance(inspect.getattr_static(cls, name), property)]


@pytest.mark.parametrize(("cls", "modes"), [(GenerationWorker, REPLICA_MODES), (TorchTrainer, RANK_MODES)])
def test_every_public_worker_method_declares_a_mode_of_its_role(cls, modes):
    undeclared = [name for name in public_methods(cls) if getattr(getattr(cls, name), "dispatch", None) not in modes]
    assert not undeclared, f"{cls.__name__}: {undeclared} declare no {sorted(m.name for m in modes)} mode"


def test_every_dispatch_member_is_carried_out():
    assert set(MODES) == set(Dispatch)
    assert RANK_MODES | REPLICA_MODES == set(Dispatch) and not RANK_MODES & REPLICA_MODES


def answering(mode: Dispatch, name: str):
    """An actor method declaring ``mode`` that answers with the actor's index and its arguments."""

    @dispatch(mode)
    def method(self, *args):
        self.calls += 1
        return (self.index, *args)

    method.__name__ = method.__qualname__ = name
    return method


class Echo:
    """A real actor with one method per mode: each answers with its index and what it got, and
    counts its calls (so a mode that reaches the wrong actors is seen)."""

    def __init__(self, index: int):
        self.index, self.calls = index, 0

    all_ranks = answering(Dispatch.ALL_RANKS, "all_ranks")
    each_rank = answering(Dispatch.EACH_RANK, "each_rank")
    rank0 = answering(Dispatch.RANK0, "rank0")
    each_replica = answering(Dispatch.EACH_REPLICA, "each_replica")
    scatter = answering(Dispatch.SCATTER, "scatter")

    @dispatch(Dispatch.SPLIT)
    def split(self, ids, tag):
        self.calls += 1
        return StepRecord({"prompt_id": list(ids), "replica": [self.index] * len(ids), "tag": [tag] * len(ids)})

    @dispatch(Dispatch.EACH_REPLICA)
    def count(self):
        return self.calls


def test_each_mode_reaches_the_actors_it_declares_and_collects_as_it_declares(ray_local):
    actors = [ray_local.remote(Echo).options(num_cpus=0).remote(i) for i in range(3)]
    ranks, replicas = frozenset(RANK_MODES), frozenset(REPLICA_MODES)

    def on(method, *args, role=ranks):
        return call(Echo, actors, role, method, args, {})

    assert on(Echo.all_ranks, "a").get() == (0, "a")
    assert on(Echo.each_rank, "b").get() == [(0, "b"), (1, "b"), (2, "b")]
    assert on(Echo.rank0, "c").get() == (0, "c")
    assert on(Echo.each_replica, "d", role=replicas).get() == [(0, "d"), (1, "d"), (2, "d")]
    assert on(Echo.scatter, ["x", "y", "z"], "w", role=replicas).get() == [(0, "x", "w"), (1, "y", "w"), (2, "z", "w")]
    record = on(Echo.split, ["p0", "p1", "p2", "p3", "p4"], "t", role=replicas).get()
    assert record["prompt_id"] == ["p0", "p1", "p2", "p3", "p4"] and record["replica"] == [0, 0, 1, 1, 2]
    # rank 0 alone took the RANK0 call; every actor took ALL_RANKS, EACH_RANK, EACH_REPLICA, SCATTER, SPLIT
    assert on(Echo.count, role=replicas).get() == [6, 5, 5]
    with pytest.raises(ValueError, match="one item per actor"):
        on(Echo.scatter, ["x", "y"], "w", role=replicas)


def test_a_method_named_by_string_misspelt_undeclared_or_of_the_other_role_is_an_error_at_the_call():
    actors = ModelActors("m", [], [], None)  # no actor is reached: every check is at the call
    with pytest.raises(TypeError, match="not a method of TorchTrainer: name it by reference"):
        actors.on_trainers("score")
    with pytest.raises(AttributeError):
        actors.on_trainers(TorchTrainer.scroe)  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="not a method of GenerationWorker"):
        actors.on_replicas(TorchTrainer.score)
    with pytest.raises(TypeError, match="not a mode of these actors"):
        ModelActors("m", [], [], None, trainer_cls=Echo).on_trainers(Echo.scatter, [1], 2)
    with pytest.raises(TypeError, match=r"TorchTrainer.score: missing a required argument: 'rows'"):
        actors.on_trainers(TorchTrainer.score)
    with pytest.raises(TypeError, match=r"GenerationWorker.load_weights: too many positional arguments"):
        actors.on_replicas(GenerationWorker.load_weights, {}, 1, 2)

    class Undeclared(TorchTrainer):
        def extra(self) -> int:
            return 1

    with pytest.raises(TypeError, match=r"Undeclared.extra declares no dispatch mode"):
        ModelActors("m", [], [], None, trainer_cls=Undeclared).on_trainers(Undeclared.extra)


def test_the_typed_call_reads_the_methods_signature():
    """``on_trainers(TorchTrainer.score, record)``: the method's own parameters type the call's
    arguments (a ParamSpec), readable by a type checker and by inspect."""
    hints = inspect.signature(ModelActors.on_trainers).parameters
    assert str(hints["method"].annotation) == "Callable[Concatenate[Any, P], Any]"
    assert str(hints["args"].annotation) == "P.args" and str(hints["kwargs"].annotation) == "P.kwargs"


def _direct_actor_calls(path: Path) -> list[str]:
    """``x.method.remote(...)`` in ``path``: a method called on an actor handle (``cls.options(...)
    .remote(...)`` starts an actor: not a call on one)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "remote"
                and isinstance(node.func.value, ast.Attribute) and node.func.value.attr != "options"):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node.func)}")
    return found


def test_no_driver_code_calls_a_replica_or_trainer_rank_but_through_the_dispatch_layer():
    """The dispatch layer alone calls methods on actors; Ray Serve's deployment handles (serving)
    are not a model's replicas or ranks."""
    allowed = {ROOT / "orchestrator" / "cluster" / "actor_calls.py", ROOT / "orchestrator" / "serving" / "serve.py"}
    found = [hit for path in sorted((ROOT / "orchestrator").rglob("*.py")) if path not in allowed
             for hit in _direct_actor_calls(path)]
    assert not found, "call these through ModelActors.on_trainers / on_replicas / on_replicas_at:\n" + "\n".join(found)


def test_call_sites_name_methods_by_reference_not_by_string():
    strings = []
    for path in sorted((ROOT / "orchestrator").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("on_trainers", "on_replicas", "on_replicas_at")
                    and any(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args[:2])):
                strings.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not strings, strings



class Donor:
    """A donor's trainer rank, as far as the train phase sees it: a call that answers."""

    def ping(self):
        return True


class Receiver:
    """A receiver's ``train`` whose fetch of its donor's per-token log-probs failed: Ray raises
    ``OwnerDiedError`` there when the owning rank has died (seen on this machine when the fetch
    follows the kill at once; the timing cannot be forced in a test, so the call fails by itself)."""

    def train(self):
        raise RuntimeError("the donor's log-probs could not be fetched (their owner died)")


def test_a_donor_death_seen_first_as_its_receivers_failed_fetch_is_raised_as_that_death(ray_local):
    """The train phase collects every model's ``train`` together (``get_each``): a receiver listed
    first whose call failed because its donor's rank died does not stop the run with its own error;
    the donor's death is what is raised, so the controller restarts it. Collected one model after
    the other, as before, the receiver's error was raised and the run stopped."""
    from ray.exceptions import RayActorError

    from orchestrator.cluster.actor_calls import Pending, get_each

    donor = ray_local.remote(Donor).options(num_cpus=0).remote()
    receiver = ray_local.remote(Receiver).options(num_cpus=0).remote()
    ray_local.kill(donor)
    with pytest.raises(RayActorError):  # dead before the phase collects
        ray_local.get(donor.ping.remote())
    pending = {"receiver": Pending([receiver.train.remote()], Dispatch.RANK0),
               "donor": Pending([donor.ping.remote()], Dispatch.RANK0)}
    with pytest.raises(RayActorError):
        get_each(pending)
    ray_local.kill(receiver)
