"""A pair run on a multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head and
two worker nodes, all on 127.0.0.1) that loses the node holding one model's generation replica and
both its trainer ranks as a step's generation starts, as a cloud GPU node is lost under the GPU
template (``placement: pack`` puts a model's replica and ranks on one 4-GPU node). Run as a script
(``tests/test_node_loss.py``) so that its cluster never meets the test session's local Ray instance.

The gpt2 model's bundles ask for a custom resource both worker nodes hold, so its placement group
packs them on one of the two and is rescheduled on the other when that node goes. The llama model,
the verifier and the driver stay on the head. The last sync's weights are rank 0's return value,
whose only copy was in the lost node's object store. Writes ``result.json`` in OUT: the summary,
or the error that ended the run.

``python -m tests.node_loss_run OUT LOSE_AT override ...``
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

from orchestrator.cluster.local_ray import use_loopback

MODEL = "gpt2-bpe"
NODE_OVERRIDES = ["models.1.placement=pack", "models.1.trainer.workers=2",
                  "models.1.generation.resources={gpu_node: 0.1}", "models.1.trainer.resources={gpu_node: 0.1}"]


def main(out: Path, lose_at: int, overrides: list[str]) -> int:
    use_loopback()
    import ray
    from ray.cluster_utils import Cluster

    from orchestrator.config import load_config
    from orchestrator.controller.loop import Controller

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 6, "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=2, resources={"gpu_node": 1}) for _ in range(2)]
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    result: dict = {}

    class NodeLost(Controller):
        """Removes the node holding the model's replica and ranks as step ``lose_at`` starts."""

        def step(self, step: int):
            if step == lose_at and "lost" not in result:
                placed = self.actors[MODEL].nodes()
                nodes = set(placed["generation"]) | set(placed["trainers"])
                assert len(nodes) == 1, f"{MODEL}'s actors are not packed on one node: {placed}"
                node = next(w for w in workers if w.node_id in nodes)
                cluster.remove_node(node)
                result["lost"] = node.node_id
            return super().step(step)

    config = load_config(Path(__file__).resolve().parent.parent / "configs" / "demo_pair.yaml",
                         [*overrides, *NODE_OVERRIDES])
    try:
        result["summary"] = NodeLost(config).run()
    except Exception as exc:  # noqa: BLE001 - what ended the run is the result
        result["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        result["traceback"] = traceback.format_exc()[-4000:]
    (out / "result.json").write_text(json.dumps(result, indent=2, default=str))
    ray.shutdown()
    cluster.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]))
