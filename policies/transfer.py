"""The transfer registry: how a receiver learns from what it is routed (``exchange.transfer``).

A transfer owns the receiver side of an exchange: which donor groups it can use (``usable``),
the kind and samples of each route it makes of a routing's triples (``graftpool.contracts.Route``,
trained by the route kinds of ``workers/receiver/kinds/``), the receivers' objective and the
settings it sets on every trainer rank. It declares the routings it fits (``routings``); any
other pairing is refused at load. The transfers: ``graft`` and ``luffy`` (policies/graft.py,
policies/luffy.py), ``sgt`` (policies/sgt.py), ``hacpo`` (policies/hacpo.py).

A transfer may bring route kinds of its own (``row_kinds``: the trainer side, objects of
``workers.receiver.kinds.RowKind``): registering the transfer registers them
(``graftpool.contracts.ROW_KINDS``), and every trainer rank imports the transfer's module
(``kind_modules``, :meth:`Transfer.kind_modules`), so that a new transfer is one file, its
policy side and its trainer side in one registered class (``tests/test_transfer_plugin.py``).
This package stays NumPy-only: such a file imports both this module and the workers' kinds, so
it sits above both layers (a plugin), never inside ``policies/``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from graftpool.contracts import ROW_KINDS, ExchangeInput, ObjectiveSpec, Route
from graftpool.registry import Registry
from policies.interface import KeepsState, build
from policies.routing import Triple


class Transfer(KeepsState):
    """Base of every transfer; a dataclass whose fields are its parameters."""

    name: str = ""
    routings: tuple[str, ...] = ()  # the routings (``policies.routing``) it makes sense with
    # True: the source side (the record's mean_logp) must come from the trainers' pre-update pass
    recompute_source: bool = False
    # the trainer side of the route kinds it brings (``workers.receiver.kinds.RowKind`` objects);
    # the built-in transfers emit the built-in kinds of workers/receiver/kinds/
    row_kinds: tuple[Any, ...] = ()
    # the ``exchange`` receiver fields (``workers.training.settings.ReceiverSection``) its route kinds
    # read; a config that sets another is told at load it has no effect (orchestrator.config.loading).
    # None: every one (the gate, peer advantages, placement, peer ratio: the ``graft`` kind's)
    receiver_fields: tuple[str, ...] | None = None

    def usable(self, inp: ExchangeInput) -> np.ndarray:
        """[M, P] bool: the groups this transfer can learn from. Default: Eq. 4's mixed groups,
        1 <= k < n (a success and a failure, so the donor's advantages are not all zero)."""
        k = inp.k
        return (k >= 1) & (k < inp.n)

    def routes(self, triples: list[Triple], inp: ExchangeInput) -> list[Route]:  # pragma: no cover
        raise NotImplementedError

    def objective(self, n: int) -> ObjectiveSpec | None:
        """The receivers' objective for groups of ``n``; None: the token-level one of Eq. 10."""
        return None

    def trainer_params(self) -> dict[str, Any]:
        """Settings it sets on every trainer rank (``workers.training.settings.TrainerSettings`` fields)."""
        return {}

    def kind_modules(self) -> tuple[str, ...]:
        """The modules every trainer rank imports to have this transfer's ``row_kinds`` registered
        (its own module where it brings kinds, by a name the ranks can import:
        :func:`importable_module`; none otherwise)."""
        return (importable_module(type(self).__module__, f"exchange.transfer {self.name!r}"),) if self.row_kinds else ()


def importable_module(module: str, what: str) -> str:
    """The name another process (a trainer rank) imports ``module`` by. A class defined in the
    script the job runs is in module ``__main__``, which in a rank is Ray's own worker script:
    its name there is the script's module, ``__main__.__spec__.name`` under ``python -m NAME``,
    else the script's path relative to the working directory with dots for slashes
    (``python my_run.py``: ``my_run``; ``ray job submit --working-dir`` ships that directory and
    puts it on every worker's path; the script's ``if __name__ == "__main__":`` block does not
    run there). A script outside the working directory raises ValueError naming ``what``."""
    if module != "__main__":
        return module
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name != "__main__":
        return spec.name
    script = getattr(main, "__file__", None)
    if script:
        path, here = Path(script).resolve(), Path.cwd().resolve()
        parts = path.relative_to(here).with_suffix("").parts if path.is_relative_to(here) and path.suffix == ".py" else ()
        if parts and all(part.isidentifier() for part in parts):
            return ".".join(parts)
    raise ValueError(f"{what}: its row kinds are defined in the script this process runs ({script or 'no file'}), "
                     f"which the trainer ranks cannot import from the working directory {Path.cwd()}; move the "
                     f"transfer into a module there and import it from the script")


TRANSFERS: Registry[type[Transfer]] = Registry("transfer", "exchange.transfer")
available_transfers = TRANSFERS.names


def register_transfer(name: str):
    """Class decorator: make ``cls`` available as ``exchange.transfer: <name>``, and register the
    row kinds it brings (``cls.row_kinds``) under their names."""

    def wrap(cls: type[Transfer]) -> type[Transfer]:
        for kind in cls.row_kinds:
            ROW_KINDS.register(kind.name)(kind)
        return TRANSFERS.register_named(name)(cls)

    return wrap


def make_transfer(name: str, params: dict[str, Any], field: str = "exchange.transfer") -> Transfer:
    """A registered transfer with ``params`` typed and checked; errors name ``field``."""
    return build(TRANSFERS.get(name), name, params, field, "transfer")
