"""Waiting on a cluster for the nodes a job's bundles need, asking Ray's autoscaler for them.

A cluster launched with ``ray up`` (``cluster.yaml``) may start with its head only: the GPU
workers are at ``min_workers: 0`` and the autoscaler adds them when something asks. So the
driver, connected to a cluster, does not compare what is there with what it needs and fail:

1. if the live nodes already hold every bundle (:func:`unplaced` is empty), it goes on;
2. a cluster without an autoscaler (its monitor on this machine runs without
   ``--autoscaling-config``: a plain ``ray start --head``) never grows: it fails at once;
3. a bundle that no node type of the autoscaling config can hold, whatever the autoscaler
   does, fails at once, naming the bundle and the node types (:func:`never_fits`);
4. else it asks the autoscaler for the bundles (``ray.autoscaler.sdk.request_resources``) and
   waits, saying every :data:`REPORT_EVERY_S` what the cluster still cannot hold, until it can
   or ``ray.wait_for_resources_s`` runs out; the request is withdrawn either way.

The node types come from the autoscaling config the cluster's monitor process was started with
(Ray 2.60 has no API that lists them): found in /proc where the driver runs on the head, as a
``ray job submit`` job does. Where it is not found (a driver on another node, an autoscaler in
another container), step 3 is left out and the wait alone decides.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import ray
import yaml

Bundle = dict[str, float]

REPORT_EVERY_S = 30.0
POLL_S = 1.0
MONITOR = "monitor.py"  # the autoscaler's process: ray/autoscaler/_private/monitor.py (v2: .../v2/monitor.py)


def shape(bundle: Bundle) -> str:
    """``{CPU: 0.5, GPU: 1}``"""
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in bundle.items()) + "}"


def describe(bundles: list[Bundle]) -> str:
    """``2 x {CPU: 0.5, GPU: 1}, 1 x {CPU: 0.25}``: the bundles by shape, in first-seen order."""
    shapes = Counter(tuple(b.items()) for b in bundles)
    return ", ".join(f"{n} x {shape(dict(items))}" for items, n in shapes.items())


def fits(bundle: Bundle, capacity: dict[str, float]) -> bool:
    return all(capacity.get(k, 0.0) >= v for k, v in bundle.items() if v > 0)


PLAIN = frozenset({"CPU", "memory", "object_store_memory"})
"""Resources every node has; any other (GPU, a custom resource such as ``trainer``) is scarce."""


def _scarce(resources: dict[str, float]) -> int:
    """How many scarce kinds (not :data:`PLAIN`, not a node's own ``node:<ip>`` label) it names."""
    return sum(1 for k, v in resources.items() if v > 0 and k not in PLAIN and not k.startswith("node:"))


def unplaced(bundles: list[Bundle], nodes: list[dict[str, float]]) -> list[Bundle]:
    """The bundles that do not fit on the nodes (their total resources). Bundles that need scarce
    resources go first (GPUs, then the number of scarce kinds, then CPUs), and each goes to the
    fitting node with the fewest scarce kinds it does not need: a CPU-only bundle fills a plain
    node before it takes the CPUs of a node that a GPU or ``trainer`` bundle needs (whatever the
    order in which Ray lists the nodes). Empty: the nodes can hold them all."""
    free = [dict(n) for n in nodes]
    left = []
    order = sorted(bundles, key=lambda b: (b.get("GPU", 0.0), _scarce(b), b.get("CPU", 0.0)), reverse=True)
    for bundle in order:
        fitting = [n for n in free if fits(bundle, n)]
        node = min(fitting, key=lambda n: _scarce(n) - _scarce({k: n.get(k, 0.0) for k in bundle}), default=None)
        if node is None:
            left.append(bundle)
            continue
        for k, v in bundle.items():
            node[k] = node.get(k, 0.0) - v
    return left


def live_nodes() -> list[dict[str, float]]:
    """The total resources of each live node of the cluster Ray is connected to."""
    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


@dataclass(frozen=True)
class NodeType:
    """A node type of an autoscaling config (``available_node_types``) that can ever run."""

    name: str
    resources: dict[str, float]


def node_types(config: dict) -> list[NodeType] | None:
    """The node types a cluster can ever have, from its autoscaling config (``cluster.yaml``'s
    shape): the head's type, and every worker type whose ``max_workers`` (default: the
    cluster's) is above 0. None when a type leaves out its ``resources`` (the cloud provider
    fills them in at launch: they are not known here)."""
    head = config.get("head_node_type")
    default_max = config.get("max_workers", 2)
    types = []
    for name, spec in (config.get("available_node_types") or {}).items():
        if name != head and spec.get("max_workers", default_max) <= 0:
            continue
        if "resources" not in spec:
            return None
        types.append(NodeType(name, {k: float(v) for k, v in spec["resources"].items()}))
    return types


def never_fits(bundles: list[Bundle], types: list[NodeType]) -> list[Bundle]:
    """The bundles no node type can hold, however many nodes the autoscaler starts."""
    return [b for b in bundles if not any(fits(b, t.resources) for t in types)]


def monitor_command(gcs_address: str) -> tuple[list[str], Path] | None:
    """The command line and working directory of the autoscaler monitor of the cluster at
    ``gcs_address``, if it runs on this machine (Linux /proc); None when not found."""
    flag = f"--gcs-address={gcs_address}"
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return None
    for entry in entries:
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            if flag in args and any(a.endswith(MONITOR) for a in args):
                return args, Path(os.readlink(f"/proc/{entry}/cwd"))
        except OSError:
            continue
    return None


def autoscaling_config_path(args: list[str], cwd: Path) -> Path | None:
    """The monitor's ``--autoscaling-config`` (``~`` and a relative path resolved as it does)."""
    for i, arg in enumerate(args):
        if arg.startswith("--autoscaling-config="):
            value = arg.split("=", 1)[1]
        elif arg == "--autoscaling-config" and i + 1 < len(args):
            value = args[i + 1]
        else:
            continue
        return cwd / Path(value).expanduser()
    return None


def cluster_says(nodes: list[dict[str, float]]) -> str:
    """What the live nodes hold in all, CPUs and GPUs first: ``2 nodes, CPU 5, GPU 0``."""
    have = Counter()
    for node in nodes:
        have.update({k: v for k, v in node.items() if k in ("CPU", "GPU") or not _builtin(k)})
    parts = [f"{k} {have.get(k, 0.0):g}" for k in ("CPU", "GPU")]
    parts += [f"{k} {v:g}" for k, v in sorted(have.items()) if k not in ("CPU", "GPU")]
    return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}, {', '.join(parts)}"


def _builtin(resource: str) -> bool:
    """Ray's own per-node resources (memory, object store, node and accelerator markers)."""
    return resource in ("memory", "object_store_memory") or resource.startswith(("node:", "accelerator_type:"))


def wait_for_bundles(bundles: list[Bundle], timeout_s: float) -> None:
    """Return once the cluster Ray is connected to can hold ``bundles``; wait for its
    autoscaler up to ``timeout_s`` (``ray.wait_for_resources_s``); raise ``RuntimeError``
    where it never can (the steps of the module's docstring)."""
    if not unplaced(bundles, live_nodes()):
        return
    asked = describe(bundles)
    monitor = monitor_command(ray.get_runtime_context().gcs_address)
    path = autoscaling_config_path(*monitor) if monitor else None
    if monitor is not None and path is None:
        raise RuntimeError(
            f"the Ray cluster ({cluster_says(live_nodes())}) cannot hold the job's bundles ({asked}; it cannot "
            f"place {describe(unplaced(bundles, live_nodes()))}) and has no autoscaler to add nodes (its monitor "
            "runs without --autoscaling-config): lower models[].generation / models[].trainer num_cpus, num_gpus, "
            "resources, replicas, workers or data.verifier_actors, or add nodes")
    types = node_types(yaml.safe_load(path.read_text())) if path is not None and path.is_file() else None
    if types is not None and (never := never_fits(bundles, types)):
        kinds = "; ".join(f"{t.name} {shape({k: v for k, v in t.resources.items() if not _builtin(k)})}"
                          for t in types) or "none"
        raise RuntimeError(
            f"no node type of the cluster can hold the job's bundle(s) {describe(never)}, however many nodes the "
            f"autoscaler starts (node types of {path}: {kinds}): lower models[].generation / models[].trainer "
            "num_cpus, num_gpus or resources, or add a node type that holds them")
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=bundles)
    start = last_report = time.monotonic()
    try:
        print(f"waiting up to {timeout_s:g} s (ray.wait_for_resources_s) for the autoscaler to add the nodes of "
              f"the job's bundles: {asked}", flush=True)
        while left := unplaced(bundles, nodes := live_nodes()):
            waited = time.monotonic() - start
            if waited >= timeout_s:
                raise RuntimeError(
                    f"after {waited:.0f} s the Ray cluster ({cluster_says(nodes)}) still cannot hold {describe(left)} "
                    f"of the job's bundles ({asked}): the autoscaler did not add the nodes (see `ray status` and the "
                    "head's logs/monitor.*); raise ray.wait_for_resources_s to wait longer, or lower "
                    "models[].generation / models[].trainer num_cpus, num_gpus, resources")
            if time.monotonic() - last_report >= REPORT_EVERY_S:
                last_report = time.monotonic()
                print(f"waited {waited:.0f} s for the autoscaler: the cluster ({cluster_says(nodes)}) cannot yet "
                      f"hold {describe(left)}", flush=True)
            time.sleep(POLL_S)
        print(f"the cluster holds the job's bundles after {time.monotonic() - start:.0f} s "
              f"({cluster_says(nodes)})", flush=True)
    finally:
        request_resources(bundles=[])  # withdrawn: the job's placement groups keep the nodes busy now
