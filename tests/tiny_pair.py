"""Helpers over the tiny-pair fixtures (``paths``, ``rollouts`` in ``tests/conftest.py``)."""

from __future__ import annotations

from workers.training.trainer import Graft


def grafts_for(receiver: str, donor: str, groups) -> list[Graft]:
    """The donor's mixed groups on the receiver's all-fail prompts (Eq. 4), as grafts."""
    return [Graft(d) for r, d in zip(groups[receiver], groups[donor], strict=True) if r.k == 0 and d.is_mixed]
