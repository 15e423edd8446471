"""Name -> implementation registries: generation backends, trainers, verifiers, policies.

A new backend or policy is one file that decorates its class with ``REGISTRY.register(name)``.
Implementations that need an optional extra (vLLM, DeepSpeed) are listed as ``lazy``
modules: importing them is deferred to the first lookup, so a missing extra costs nothing
until a config asks for it.

A registry whose names are looked up inside the actors (``in_actors``: a generation backend in each
replica, a verifier in each verifier actor, the update's parts in each trainer rank) takes an entry
only from the project's own packages or a module its ``lazy`` entries name: the driver's registries
hold what its process imported (a user's run script imported the module), but an actor, on another
node, imports only the package and the lazy modules, so the name would pass the config's check at
load and be unknown in every actor once the cluster had started them.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")

# the project's top-level packages, which every process of a run (driver and actors) can import
PROJECT_PACKAGES = frozenset({"graftpool", "workers", "policies", "orchestrator", "dashboards", "benchmarks", "tests"})


class Registry(Generic[T]):
    def __init__(self, what: str, field: str, lazy: Mapping[str, str] | None = None, in_actors: str | None = None):
        self.what = what  # "backend", "policy", ... (for messages)
        self.field = field  # the config field that names an entry (for messages)
        self.lazy = dict(lazy or {})  # name -> module that registers it when imported
        self.in_actors = in_actors  # the actors that look a name up in their own process; None: the driver
        self._entries: dict[str, T] = {}

    def register(self, name: str, module: str | None = None) -> Callable[[T], T]:
        """Class decorator; registering a different class under a taken name is an error.
        ``module``: the module an instance entry comes from, where the caller is a helper that
        wraps a user's function (``register_gate_kind``); by default the caller's."""

        caller = module or sys._getframe(1).f_globals.get("__name__", "")  # the module registering it

        def wrap(entry: T) -> T:
            # a class or function by the module that defines it; an instance (its __module__ is its
            # class's) by the module that registers it
            own = entry.__module__ if isinstance(entry, type) or inspect.isfunction(entry) else None
            self.check_reachable(name, own or caller)
            if self._entries.get(name, entry) is not entry:
                raise ValueError(f"{self.what} {name!r} is already registered")
            self._entries[name] = entry
            return entry

        return wrap

    def check_reachable(self, name: str, module: str) -> None:
        """Refuse an entry the actors (``in_actors``) could not import: registered by a module
        outside the project's packages that no ``lazy`` entry names (see the module docstring)."""
        if self.in_actors is None or name in self.lazy or module.split(".")[0] in PROJECT_PACKAGES:
            return
        raise ValueError(f"{self.field}: {self.what} {name!r} is registered by module {module!r}, which "
                         f"{self.in_actors} do not import (they look the name up in their own process); "
                         f"put it in a module of the working directory and add {name!r}: 'your_module' to "
                         f"the lazy= mapping where this registry is declared in the project's source, "
                         "which every process imports on its first lookup (a change to .lazy made by a run "
                         "script reaches no actor)")

    def register_named(self, name: str) -> Callable[[T], T]:
        """:meth:`register`, and the class's ``name`` set to ``name`` (what it is called in configs)."""

        def wrap(entry: T) -> T:
            self.register(name)(entry)
            entry.name = name  # type: ignore[attr-defined]
            return entry

        return wrap

    def unregister(self, name: str) -> None:
        """Remove the entry registered as ``name`` (a test's); a lazy name stays known."""
        self._entries.pop(name, None)

    def names(self) -> list[str]:
        return sorted({*self._entries, *self.lazy})

    def get(self, name: str) -> T:
        """The entry registered as ``name``; an unknown name fails naming the config field."""
        if name not in self._entries and name in self.lazy:
            importlib.import_module(self.lazy[name])
        if name not in self._entries:
            raise ValueError(f"{self.field}: unknown {self.what} {name!r}; expected one of {self.names()}")
        return self._entries[name]
