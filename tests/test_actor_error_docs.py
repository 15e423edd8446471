"""What the docs say a GPU's out-of-memory in an actor does, against what the driver sees.

A ``torch.OutOfMemoryError`` raised in an actor method (what CUDA's allocator raises on a GPU;
a CPU's allocator raises a plain ``RuntimeError``, so the class is raised here by hand) reaches
the driver as Ray's task error, an instance of the cause's class, and is none of the deaths
(``DEATHS``) that the fault handling restarts an actor for: the run stops with it. The docs once
said such a rank "is restarted within run.max_restarts"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def test_an_out_of_memory_error_in_an_actor_reaches_the_driver_as_no_death(ray_local):
    from orchestrator.cluster.actor_calls import DEATHS, get_all

    @ray_local.remote(num_cpus=0)
    class Rank:
        def update(self) -> None:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.93 GiB")

        def alive(self) -> bool:
            return True

    rank = Rank.remote()
    with pytest.raises(torch.OutOfMemoryError) as caught:
        get_all([rank.update.remote()])
    assert not isinstance(caught.value, DEATHS)
    assert ray_local.get(rank.alive.remote())  # the actor lives on: nothing is restarted


def test_the_docs_say_an_out_of_memory_error_stops_the_job_and_restarts_nothing():
    scale = " ".join((ROOT / "docs" / "scale.md").read_text().split())
    # the claim, not the eighteenth read's row that quotes it in backticks
    assert not re.search(r"(?<!`)runs out of memory, the rank is restarted(?!`)", scale)
    operations = " ".join((ROOT / "docs" / "operations.md").read_text().split())
    not_survived = operations.split("Not survived in the process")[1].split("## Security")[0]
    assert "torch.OutOfMemoryError" in not_survived and "not retried" in not_survived
