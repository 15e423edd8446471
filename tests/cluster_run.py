"""A pair run on a multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head
and three worker nodes, all on 127.0.0.1), for the multi-node test of ``tests/test_faults.py``; run as a script so
that its cluster never meets the test session's local Ray instance.

The gpt2 model spreads (``placement: spread``): its generation replica is pinned by a custom
resource to the node ``gen`` and its two trainer ranks to the nodes ``t1`` and ``t2``; the llama
model, the verifier and the driver stay on the head. Once the step-``remove_after`` checkpoint
is written, node ``t2`` is removed: the rank there dies and the job recovers from that
checkpoint on the nodes left. Writes ``result.json`` in OUT: the nodes, where every actor ran
before and after the removal (from the run folder's ``actors.json``) and the summary.

``python -m tests.cluster_run OUT REMOVE_AFTER override ...`` (the overrides name the run
``cluster`` in OUT and set its checkpoints, as ``tests/reference_run.py`` does)
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from orchestrator.cluster.local_ray import use_loopback

CLUSTER_OVERRIDES = [
    "models.1.placement=spread",
    "models.1.trainer.workers=2",
    "models.1.generation.resources={gen: 0.1}",
    "models.1.trainer.resources={trainer: 0.1}",
]


def main(out: Path, remove_after: int, overrides: list[str]) -> int:
    use_loopback()
    import ray
    from ray.cluster_utils import Cluster

    from orchestrator.config import load_config
    from orchestrator.controller.loop import train

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 6, "include_dashboard": False})
    nodes = {"gen": cluster.add_node(num_cpus=1, resources={"gen": 1}),
             "t1": cluster.add_node(num_cpus=1, resources={"trainer": 1}),
             "t2": cluster.add_node(num_cpus=1, resources={"trainer": 1})}
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    result: dict = {"nodes": {name: node.node_id for name, node in nodes.items()},
                    "head": cluster.head_node.node_id}
    config = load_config(Path(__file__).resolve().parent.parent / "configs" / "demo_pair.yaml",
                         [*overrides, *CLUSTER_OVERRIDES])
    run_dir = out / "cluster"

    def remove_when_checkpointed() -> None:
        marker = run_dir / "checkpoints" / f"step_{remove_after:06d}"
        while not marker.exists():
            time.sleep(0.05)
        result["before"] = json.loads((run_dir / "actors.json").read_text())
        cluster.remove_node(nodes["t2"])
        result["removed_after_step"] = remove_after

    watcher = threading.Thread(target=remove_when_checkpointed, daemon=True)
    watcher.start()
    result["summary"] = train(config)
    watcher.join(5)
    result["after"] = json.loads((run_dir / "actors.json").read_text())
    (out / "result.json").write_text(json.dumps(result, indent=2))
    ray.shutdown()
    cluster.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]))
