"""What every settings section shares, in the config and in the actors that receive it: strict
pydantic models (an unknown key is an error) and names checked against a registry.

A config section whose fields an actor reads is defined once, next to the actor's code
(``workers.training.settings``, ``workers.rollout.settings``); ``orchestrator.config`` extends it
with what only the driver reads, and the actor's settings record is built from the config's
own section objects (:meth:`Section.values_of`), so a field is declared, defaulted and checked
in one place.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict

from graftpool.registry import Registry


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def registered(registry: Registry, *also: str) -> Any:
    """``str`` checked against ``registry``'s names when validated (plus the names ``also``, such
    as ``auto``): a name registered later, by a plugin or a test, is accepted; any other name is
    refused with the registered ones. Reading the names imports no implementation (its lazy
    entries, ``graftpool.registry.Registry``)."""

    def check(name: str) -> str:
        names = [*also, *registry.names()]
        if name not in names:
            raise ValueError(f"expected one of {names}")  # the error names the value (pydantic: input)
        return name

    return Annotated[str, AfterValidator(check)]


S = TypeVar("S", bound="Settings")


class Settings(Strict):
    """An actor's settings record: the fields of the config sections it reads (its bases, each a
    :class:`Strict` section) plus what the driver derives; frozen."""

    model_config = ConfigDict(frozen=True)

    @classmethod
    def of(cls: type[S], *sections: Strict, **derived: Any) -> S:
        """The record from the config's own ``sections`` (each an instance of one or more of this
        record's section bases: every field of those bases is taken as it is) and ``derived``
        values. A section that is none of the bases, or a derived value for a field a section
        gives, raises ``TypeError``."""
        bases = [base for base in cls.__bases__ if base is not Settings]
        values: dict[str, Any] = {}
        for section in sections:
            kinds = [base for base in bases if isinstance(section, base)]
            if not kinds:
                raise TypeError(f"{cls.__name__}: {type(section).__name__} is none of its sections "
                                f"({', '.join(b.__name__ for b in bases)})")
            for kind in kinds:
                values.update({name: getattr(section, name) for name in kind.model_fields})
        clash = sorted(set(values) & set(derived))
        if clash:
            raise TypeError(f"{cls.__name__}: {', '.join(clash)} come from the config's sections, not derived")
        return cls(**values, **derived)

    def with_changes(self: S, **changes: Any) -> S:
        """A copy with ``changes`` applied and checked; a name that is not a setting raises
        ``TypeError`` naming it and the settings there are."""
        known = set(type(self).model_fields)
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TypeError(f"unknown {type(self).__name__} setting(s) {', '.join(unknown)}; "
                            f"the settings are: {', '.join(sorted(known))}")
        return type(self)(**{**dict(self), **changes})
