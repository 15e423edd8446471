"""The driver's side of getting a model folder to the nodes of its actors (``workers.model_files``).

A model folder the driver resolved (a zoo build or GGUF conversion in its cache, or a folder
the user named, perhaps relative to the driver's working directory) goes to the actors by its
absolute path. :class:`ModelShipment` asks each node that holds one of the model's actors,
other than the driver's own (same filesystem), whether it sees that folder with the driver's
fingerprint (a zero-CPU Ray task pinned to the node, run in the job's runtime environment as
the actors are). Where one does not (no shared disk), the folder's files are put into Ray's
object store once for the model, and every later actor of the model (a restart too) gets that
object; each node writes it once into its own cache. On one machine, or with the folder on a
disk every node mounts at the same path, nothing is read, put or copied.

A hub id stays an id (each node resolves it in its own Hugging Face cache, ``workers.hub``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

import ray
from ray.util.placement_group import placement_group_table
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from workers.file_chunks import put_files
from workers.hub import hub_id
from workers.model_files import ModelSource, fingerprint, sees


@ray.remote(num_cpus=0)
def _sees(path: str, expected: str) -> bool:
    return sees(path, expected)


def group_nodes(group) -> list[str]:
    """The Ray node ids that a placement group's bundles are on."""
    return sorted(set(placement_group_table(group)["bundles_to_node_id"].values()))


class ModelShipment:
    """One model's folder as its actors get it: :meth:`source_for` the nodes they are on."""

    def __init__(self, path: str | Path):
        self.hub = hub_id(path) is not None
        self.path = str(path) if self.hub else str(Path(path).resolve())
        self.fingerprint = "" if self.hub else fingerprint(self.path)
        self.seen = {ray.get_runtime_context().get_node_id()}  # nodes that see the folder: the driver's own
        self.unseen: set[str] = set()
        self.files: list[ray.ObjectRef] | None = None
        self.content = ""  # sha256 of the shipped files' paths and bytes (their name in a node's cache)

    def source_for(self, nodes: Iterable[str]) -> str | ModelSource:
        """What the actors on ``nodes`` load: the hub id, or the folder's :class:`ModelSource`,
        with its files shipped once any node of the model's actors does not see the folder, or
        may be one that no probe reached: a bundle whose node was lost waits for a new one (Ray's
        table names no node, ``''``, while the autoscaler replaces it), and a probe dies with its
        node; the actor started again there lands on a node no one has asked."""
        if self.hub:
            return self.path
        live = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        wanted = set(nodes)
        new = sorted((wanted & live) - self.seen - self.unseen)
        probes = [_sees.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                  .remote(self.path, self.fingerprint) for node in new]
        unreached = wanted - live
        for node, probe in zip(new, probes, strict=True):
            try:
                (self.seen if ray.get(probe) else self.unseen).add(node)
            except ray.exceptions.RayError:  # the node died meanwhile: its bundle goes elsewhere
                unreached.add(node)
        if (self.unseen or unreached) and self.files is None:
            self.ship()
        return ModelSource(self.path, self.fingerprint, self.files, self.content)

    def ship(self) -> None:
        """Put the folder's files into the object store (once)."""
        if self.files is None:
            print(f"model folder {self.path} is not seen by node(s) {', '.join(sorted(self.unseen)) or '-'} "
                  "(no shared disk), or an actor waits for a node in place of a lost one: its files go to "
                  "them through the object store", flush=True)
            # the chunks' refs in one object (a 3 B bf16 folder is 6 GB: read and put a chunk at a time),
            # hashed as they are read: a node's cached copy is named by the bytes, not by the sizes
            digest = hashlib.sha256()
            self.files = [ray.put(put_files(Path(self.path), digest=digest))]
            self.content = digest.hexdigest()
