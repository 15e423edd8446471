"""Name -> implementation registries: generation backends, trainers, verifiers, policies.

A new backend or policy is one file that decorates its class with ``REGISTRY.register(name)``.
Implementations that need an optional extra (vLLM, DeepSpeed) are listed as ``lazy``
modules: importing them is deferred to the first lookup, so a missing extra costs nothing
until a config asks for it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, what: str, field: str, lazy: Mapping[str, str] | None = None):
        self.what = what  # "backend", "policy", ... (for messages)
        self.field = field  # the config field that names an entry (for messages)
        self.lazy = dict(lazy or {})  # name -> module that registers it when imported
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Class decorator; registering a different class under a taken name is an error."""

        def wrap(entry: T) -> T:
            if self._entries.get(name, entry) is not entry:
                raise ValueError(f"{self.what} {name!r} is already registered")
            self._entries[name] = entry
            return entry

        return wrap

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
