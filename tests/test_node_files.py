"""Trainer files through the object store a chunk at a time (issue #51's second read). Without a
shared disk a rank's checkpoint reaches the driver, and comes back on a resume, through Ray's
object store. It went as one ``{path: bytes}`` object a rank, which the driver held whole: a 3 B
model's ZeRO-3 optimizer partition is 18 GB a rank, two ranks 36 GB, more than the 32 GiB of the
head in ``cluster.yaml``. Now each file goes in chunks (``workers.file_chunks.CHUNK_BYTES``, 64 MiB) and a
process holds one at a time. Chunks here are over Ray's 100 KiB inline limit, as real ones are."""

from __future__ import annotations

import os
import tracemalloc

from workers.file_chunks import get_files, put_files, read_tree
from workers.training.trainer import TorchTrainer

CHUNK = 128 * 1024


def test_a_ranks_checkpoint_goes_to_the_driver_and_back_in_chunks(ray_local, paths, tmp_path):
    rank = ray_local.remote(TorchTrainer).options(num_cpus=0.5).remote(str(paths["gpt2-bpe"]), seed=0)
    ray_local.get(rank.save.remote(str(tmp_path / "direct")))  # what a shared disk would hold
    direct = read_tree(tmp_path / "direct")
    files = ray_local.get(rank.save_files.remote(CHUNK))  # refs only: the bytes stay in the object store
    sizes = [len(ray_local.get(ref)) for chunks in files.values() for ref in chunks]
    assert len(sizes) >= 4 and max(sizes) <= CHUNK and sum(sizes) == sum(map(len, direct.values()))
    get_files(files, tmp_path / "driver")
    assert read_tree(tmp_path / "driver") == direct
    back = put_files(tmp_path / "driver", CHUNK)  # a resume: the driver sends them back, a chunk at a time
    assert ray_local.get(rank.load_files.remote(back)) == 0
    ray_local.kill(rank)


def test_what_the_driver_holds_does_not_grow_with_the_file(ray_local, paths, tmp_path):
    """Files of 4 and 16 MiB put by a rank in 256 KiB chunks: the peak of the driver's Python
    allocations while it collects and writes each (Ray's own buffers, about 1 MiB, and a chunk)
    differs by less than a chunk, and stays under the smaller file (sent whole, as before, each
    would have been held whole)."""
    chunk = 256 * 1024
    rank = ray_local.remote(TorchTrainer).options(num_cpus=0.5).remote(str(paths["gpt2-bpe"]), seed=0)

    def collected_peak(name: str, size: int) -> int:
        (tmp_path / name).mkdir()
        (tmp_path / name / "shard.pt").write_bytes(os.urandom(size))
        put = rank.__ray_call__.remote(lambda _, folder, n: put_files(folder, n), tmp_path / name, chunk)
        tracemalloc.start()
        get_files(ray_local.get(put), tmp_path / "driver" / name)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert read_tree(tmp_path / "driver" / name) == read_tree(tmp_path / name)
        return peak

    collected_peak("warm-up", chunk)  # Ray's first-call allocations: not compared
    small, large = collected_peak("small", 16 * chunk), collected_peak("large", 64 * chunk)
    assert abs(large - small) < chunk and large < 16 * chunk, (small, large)
    ray_local.kill(rank)


def test_a_step_snapshot_reaches_new_ranks_without_the_driver_holding_it(ray_local, paths, tmp_path):
    """A step snapshot (``orchestrator.controller.snapshot``, issue #51's fifth read) is each rank's
    files as one object the driver owns. A trainer's recovery hands them to the model's new ranks:
    the driver fetched every rank's files and put them back in chunks, holding them all at once
    (a 3 B ZeRO-3 model's two ranks: 37 GB, on a 32 GiB head); now each rank fetches them itself
    (``restore_trainers``). Here rank 0's snapshot, of changed weights, and a 32 MiB object
    standing for another rank's partition: the peak of the driver's Python allocations while the
    new rank loads them stays under 4 MiB, and the new rank holds the snapshot's weights."""
    import torch

    from orchestrator.cluster.model_actors import ModelActors
    from orchestrator.controller.snapshot import restore_trainers

    make = ray_local.remote(TorchTrainer).options(num_cpus=0.5)
    rank = make.remote(str(paths["gpt2-bpe"]), seed=0)

    def shift(trainer) -> None:  # weights of its own, not the model folder's
        for param in trainer.model.parameters():
            param.data.add_(0.5)

    ray_local.get(rank.__ray_call__.remote(shift))
    files, saved = rank.snapshot_files.remote()
    ray_local.get(saved)

    @ray_local.remote(num_cpus=0)
    def partition() -> dict[str, bytes]:
        return {"other_rank.pt": os.urandom(32 * 2**20)}

    other = partition.remote()
    ray_local.wait([other])
    fresh = make.remote(str(paths["gpt2-bpe"]), seed=0)
    ray_local.get(fresh.get_version.remote())
    tracemalloc.start()
    version = restore_trainers(ModelActors("gpt2-bpe", [], [fresh], None), [files, other])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert version == 0 and peak < 4 * 2**20, peak
    want, got = ray_local.get(rank.state_dict.remote()), ray_local.get(fresh.state_dict.remote())
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    for actor in (rank, fresh):
        ray_local.kill(actor)
