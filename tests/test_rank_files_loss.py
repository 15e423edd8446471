"""A trainer rank that dies after it answered a checkpoint's ``save_files`` and before the driver
fetched its chunks (issue #51's thirtieth read). Without a shared disk a rank's checkpoint files
reach the head as object-store chunks the rank owns (``workers.training.node_files``); a 3 B
ZeRO-3 model's 37 GB cross in about 550 chunks of 64 MiB, and a GPU node lost meanwhile takes them with its rank.
The driver's fetch then failed with Ray's ``OwnerDiedError``, which is no actor's death to
``faults.with_retries``: the job stopped instead of recovering the trainer. Now the rank's death
is what ``save_trainers`` raises, naming it, as for a rank that dies during its save."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from workers.file_chunks import CHUNK_BYTES, FileRefs
from workers.training.trainer import TorchTrainer

CHUNK = 128 * 1024  # over Ray's 100 KiB inline limit: the chunks stay in the object store, owned by the rank


class DiesAfterAnswering(TorchTrainer):
    """A rank that answers ``save_files`` (its chunks in the object store), then exits: a node lost
    right after the rank's answer."""

    def save_files(self, chunk_bytes: int = CHUNK_BYTES) -> FileRefs:
        files = super().save_files(CHUNK)
        Path(os.environ["RANK_PID_FILE"]).write_text(str(os.getpid()))
        threading.Timer(0.5, os._exit, (1,)).start()
        return files


class AnswersWhenPeerIsGone(TorchTrainer):
    """A rank that answers ``save_files`` only once the other rank's process has exited, so that
    the driver fetches the other rank's chunks after its death."""

    def save_files(self, chunk_bytes: int = CHUNK_BYTES) -> FileRefs:
        files = super().save_files(CHUNK)
        pid_file = Path(os.environ["RANK_PID_FILE"])
        while True:
            try:
                os.kill(int(pid_file.read_text()), 0)
            except (FileNotFoundError, ValueError, ProcessLookupError):
                if pid_file.is_file() and pid_file.read_text():
                    break
            time.sleep(0.1)
        time.sleep(1.0)  # Ray learns of the death
        return files


def test_a_rank_lost_before_the_driver_fetched_its_checkpoint_files_is_raised_as_its_death(ray_local, paths,
                                                                                           tmp_path):
    from ray.exceptions import RayActorError

    from orchestrator.cluster.model_actors import ModelActors
    from orchestrator.controller.node_layout import save_trainers

    env = {"runtime_env": {"env_vars": {"RANK_PID_FILE": str(tmp_path / "rank1.pid")}}}
    rank0 = ray_local.remote(AnswersWhenPeerIsGone).options(num_cpus=0.5, **env).remote(
        str(paths["gpt2-bpe"]), seed=0)
    rank1 = ray_local.remote(DiesAfterAnswering).options(num_cpus=0.5, **env).remote(
        str(paths["gpt2-bpe"]), seed=0)
    name = "gpt2-bpe"
    ctrl = SimpleNamespace(names=[name], actors={name: ModelActors(name, [], [rank0, rank1], None)},
                           shared={name: False})
    with pytest.raises(RayActorError) as raised:  # with_retries takes it for the rank's death: TrainerLost
        save_trainers(ctrl, tmp_path / "checkpoint")
    assert raised.value.actor_id == rank1._actor_id.hex()
    ray_local.kill(rank0)
