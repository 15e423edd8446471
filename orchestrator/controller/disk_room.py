"""Room on the run folder's disk for the checkpoints still to come (``run.keep_checkpoints``).

A checkpoint is written whole before the oldest goes (``orchestrator.controller.checkpoint``), so
with ``keep`` = ``run.keep_checkpoints`` the disk holds keep + 1 of them at the peak. After each
save, with ``present`` complete checkpoints on the disk and ``future`` saves still to come in the
run, those saves need

    need = (min(present + future, keep + 1) - present) x size

bytes more than the disk holds now, ``size`` being the checkpoint just written (the sum of its
files' sizes; every checkpoint of a run holds the same weights and optimiser state). Where the
disk's free space is short of ``need`` the run stops at this save, with a complete checkpoint to
resume from, naming the figures and the fields: not at a later save, half-way through its files,
after the steps in between; a resume checks it before its first step, its run folder first cut to
the last ``keep`` (``checkpoint.keep_on_resume``). The GPU template's two 3 B ZeRO-3 models on ``cluster.yaml``'s head
(docs/scale.md, fifth read): 75.6 GB a checkpoint, 226.7 GB at the peak. A step-0 checkpoint
holds no AdamW moments yet (made at the first update: DeepSpeed ZeRO-3 on CPU, 4.5 bytes a
parameter at step 0 and 12.5 after one update, measured on a 113 k-parameter model whose extra
half byte a parameter is DeepSpeed's own helper files: 12 a parameter at 3 B), so a shortfall of
the full-size ones shows at the next save.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from orchestrator.config import ConfigError


def folder_bytes(folder: Path) -> int:
    """The sizes of the files under ``folder``, summed."""
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def saves_to_come(step: int, steps: int, every: int) -> int:
    """Checkpoints written after step ``step`` in a run of ``steps`` steps, one every ``every``
    steps (0: none): the steps in (step, steps] that ``every`` divides."""
    return steps // every - step // every if every else 0


def check_room(checkpoint: Path, present: int, future: int, keep: int) -> None:
    """Raise :class:`ConfigError` where the disk of ``checkpoint`` (just written) has less free
    space than the ``future`` saves still to come need (see the module docstring), ``present``
    complete checkpoints being on it now and ``keep`` (``run.keep_checkpoints``) kept."""
    size = folder_bytes(checkpoint)
    extra = min(present + future, keep + 1) - present
    need = extra * size
    free = shutil.disk_usage(checkpoint).free
    if need > free:
        raise ConfigError(
            f"run.keep_checkpoints: the run folder's disk ({checkpoint.parent}) has {free / 1e9:.1f} GB free, but "
            f"checkpoint {checkpoint.name} is {size / 1e9:.1f} GB and the run's later checkpoints need "
            f"{need / 1e9:.1f} GB more ({extra} more on the disk at once: run.keep_checkpoints = {keep} are kept, and "
            "each new one is written whole before the oldest is deleted); put run.output_dir on a larger disk "
            "(cluster.yaml: the head's VolumeSize) or lower run.keep_checkpoints (1 at the least); "
            "resume from this checkpoint with --resume")
