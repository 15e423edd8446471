"""A single-machine Ray instance that listens on 127.0.0.1 only (tests, the demo).

What binds where in Ray 2.60 (measured with ``ss -ltnp`` on a host with eth0 192.0.2.2):

* ``ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False)`` and
  ``ray start --head --node-ip-address 127.0.0.1 --dashboard-host 127.0.0.1``: the loopback
  address is rewritten to the routable one (``services.resolve_ip_for_localhost`` ->
  ``node_ip_address_from_perspective``), the node IP becomes 192.0.2.2, and then gcs_server,
  raylet (2 ports), the core-worker gRPC server of the driver and of every worker and actor,
  and the dashboard agent's gRPC server listen on ``*`` (all interfaces, v4 and v6); the
  agent's metrics server, the autoscaler monitor (44217) and the dashboard metrics port
  (44227) on 0.0.0.0; the runtime-env agent on 192.0.2.2, the agent's HTTP/job port (52365)
  on 192.0.2.2 and 127.0.0.1. Only the dashboard's HTTP port followed ``--dashboard-host``.
* The same with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` in the environment: Ray's
  single-machine mode (the default on macOS/Windows), in which ``get_node_ip_address``
  returns the loopback address. The node IP is 127.0.0.1 and every listener of the
  instance, including job drivers, JobSupervisor and actors, is on 127.0.0.1 (gRPC servers
  as ``[::ffff:127.0.0.1]``): nothing on ``*``, 0.0.0.0 or 192.0.2.2. There is no other
  bind option in 2.60 (no RAY_NODE_IP_ADDRESS or bind-address setting): the C++ servers
  follow the node IP, the Python agents ``is_localhost(node_ip)``.

Token authentication is independent of this and stays on: a new local ``ray.init`` turns it
on unless ``RAY_AUTH_MODE`` says otherwise; ``ray start --head`` turns it on when a token
exists in ``~/.ray/auth_token``. Clients of the HTTP job API (``ray job submit``) send the
token only with ``RAY_AUTH_MODE=token`` in their environment.

Three ports have fixed defaults, whatever the node IP, and so collide between instances on
one machine (the later instance runs without them): the agent's HTTP/job port 52365
(``ray start --dashboard-agent-listen-port``), the autoscaler's and the dashboard's metrics
ports 44217/44227 (env ``AUTOSCALER_METRIC_PORT``, ``DASHBOARD_METRIC_PORT``).

The setting is read when ``ray._private.ray_constants`` is imported, so :func:`use_loopback`
sets the environment (for the processes Ray starts, and job drivers they start) and patches
the constant when Ray is already imported. It is for single-machine instances only: with it,
``ray start --address`` (joining a cluster) is refused and a driver joining a remote cluster
would announce 127.0.0.1, so never apply it on cluster nodes.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from typing import Any

LOOPBACK = "127.0.0.1"
LOOPBACK_ENV: dict[str, str] = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # single-machine mode: node IP = 127.0.0.1
    "RAY_USAGE_STATS_ENABLED": "0",  # no hourly usage report to an outside server
}


def use_loopback() -> None:
    """Make Ray instances started from this process (and its children) bind to loopback."""
    os.environ.update(LOOPBACK_ENV)
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:  # imported already: the module-level flag was read then
        constants.ENABLE_RAY_CLUSTER = False


def local_ray_init_kwargs(num_cpus: int | None = None, **overrides: Any) -> dict[str, Any]:
    """``ray.init`` arguments for a fresh local instance bound to 127.0.0.1.

    Calls :func:`use_loopback` (a side effect on ``os.environ``: the environment is the only
    switch Ray 2.60 has). ``address="local"`` forces a new instance rather than attaching to
    one recorded in /tmp/ray by a ``ray start`` on this machine.
    """
    use_loopback()
    kwargs: dict[str, Any] = {"address": "local", "include_dashboard": False,
                              "dashboard_host": LOOPBACK, "_node_ip_address": LOOPBACK}
    if num_cpus is not None:
        kwargs["num_cpus"] = num_cpus
    kwargs.update(overrides)
    return kwargs


def descendants(roots: set[int]) -> set[int]:
    """``roots`` and every process below them (from /proc, Linux only)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.add(pid)
            stack.extend(children.get(pid, []))
    return seen


def _hex_to_ip(text: str) -> str:
    """An address column of /proc/net/tcp{,6}: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(text)
    packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(packed)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return f"::ffff:{ip.ipv4_mapped}"
    return str(ip)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4-mapped loopback address (a dual-stack socket)."""
    ip = ipaddress.ip_address(host)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def listening_sockets(pids: set[int]) -> list[tuple[int, str, int, str]]:
    """(pid, address, port, process name) of every TCP listener owned by ``pids``."""
    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:  # gone, or not ours to read
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] != "0A" or cols[9] not in inodes:  # 0A: LISTEN
                continue
            host, port = cols[1].split(":")
            pid = inodes[cols[9]]
            try:
                with open(f"/proc/{pid}/comm") as f:
                    name = f.read().strip()
            except OSError:
                name = "?"
            found.append((pid, _hex_to_ip(host), int(port, 16), name))
    return found


def instance_pids(temp_dir: str) -> set[int]:
    """Every process of the instance started with ``--temp-dir temp_dir`` (``ray start``):
    those naming its session folder on their command line, and all below them."""
    marker = (os.path.abspath(temp_dir).rstrip("/") + "/session_").encode()
    roots = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker in f.read():
                        roots.add(int(entry))
            except OSError:
                continue
    return descendants(roots) if roots else set()
