"""Shared fixtures.

``ray_local``: one small local Ray instance for the whole test session, so that each module
that needs Ray does not pay the several seconds of start-up again. If a session is already
initialised (a caller started one), it is reused and left running.

``address="local"`` forces a fresh instance: with ``address=None`` Ray would attach to any
cluster recorded in /tmp/ray by a ``ray start`` on this machine, where ``num_cpus`` is not
allowed. ``_node_ip_address="127.0.0.1"`` is deliberately not passed: Ray 2.60 accepts it but
rewrites loopback to the machine's routable IP (``services.resolve_ip_for_localhost``), and
its GCS and raylet listen on all interfaces either way, so it would only suggest an isolation
it does not give.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest


@pytest.fixture(scope="session")
def ray_local() -> Iterator[ModuleType]:
    import ray

    if ray.is_initialized():
        yield ray
        return
    ray.init(address="local", num_cpus=8, include_dashboard=False)
    try:
        yield ray
    finally:
        ray.shutdown()
