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
