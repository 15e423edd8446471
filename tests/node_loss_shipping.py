"""A model folder's shipment when a node of the model's placement group is lost, for
``tests/test_model_files.py``; run as a script so that its cluster never meets the test
session's local Ray instance (as ``tests/cluster_run.py``).

A ``ray.cluster_utils.Cluster`` on 127.0.0.1: a head and one worker node, the only one with the
custom resource ``slot``, which the model's one bundle asks for. The folder is seen there (one
machine), so nothing is shipped. The worker node is removed: the bundle waits for a node, as
on a cloud while the autoscaler replaces a lost GPU node. What the actors started again there are
given (``ModelShipment.source_for`` of the group's nodes) is asked then; the folder is moved
away (the new node does not see the driver's disk), a new node with a ``slot`` is added, and an
actor on the bundle loads the folder (``workers.model_files.local_model``). Prints one JSON
line: the error ``source_for`` raised (or null), whether the files were shipped, and the folder
the actor loaded, with its ``config.json``.

``python -m tests.node_loss_shipping FOLDER``
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from orchestrator.cluster.local_ray import use_loopback


def main(folder: Path) -> int:
    use_loopback()
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.placement_group import placement_group, placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from orchestrator.cluster.model_shipping import ModelShipment, group_nodes
    from workers.model_files import local_model

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    worker = cluster.add_node(num_cpus=1, resources={"slot": 1})
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    group = placement_group([{"CPU": 0.1, "slot": 1}])
    ray.get(group.ready(), timeout=120)
    shipment = ModelShipment(folder)
    shipment.source_for(group_nodes(group))  # the folder seen on the worker node: nothing shipped
    cluster.remove_node(worker)
    deadline = time.monotonic() + 120
    while worker.node_id in placement_group_table(group)["bundles_to_node_id"].values():
        assert time.monotonic() < deadline, "the lost node's bundle was never released"
        time.sleep(0.2)
    result: dict = {"bundle_nodes": sorted(placement_group_table(group)["bundles_to_node_id"].values())}
    try:
        source = shipment.source_for(group_nodes(group))  # what a restarted actor is given
        result["error"] = None
    except Exception as exc:  # noqa: BLE001 - the script reports what the restart would raise
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["shipped"] = shipment.files is not None
    if result["error"] is None:
        folder.rename(folder.with_name(folder.name + "-away"))  # the new node does not see the driver's disk
        cluster.add_node(num_cpus=1, resources={"slot": 1})  # the autoscaler's new node

        @ray.remote(num_cpus=0.1, resources={"slot": 1})
        def load(given) -> str:
            return str(local_model(given))

        strategy = PlacementGroupSchedulingStrategy(group, 0)
        loaded = Path(ray.get(load.options(scheduling_strategy=strategy).remote(source), timeout=300))
        result["loaded"], result["loaded_config"] = str(loaded), (loaded / "config.json").read_text()
    print(json.dumps(result), flush=True)
    ray.shutdown()
    cluster.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1])))
