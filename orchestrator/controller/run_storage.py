"""``run.storage``: the durable copy of a run, on a shared filesystem or in object storage.

A job works in its run folder (``run.output_dir/run.name``: local disk, possibly the uploaded
working copy of a ``ray job submit`` that disappears with the job). With ``run.storage`` set
(a local or NFS path, or any pyarrow filesystem URI: ``file:///...``, ``s3://bucket/prefix``,
``gs://...``) everything a later job needs is copied there as soon as it is written, under
``<storage>/<run.name>/``:

* each checkpoint, as a Ray Train checkpoint (``ray.train.Checkpoint``, its step in the
  checkpoint's metadata), its files uploaded under its own name and its metadata written last,
  so a ``step_*`` folder without metadata is an upload that did not finish and is never taken
  for a checkpoint (nothing is renamed: an object store has no folder rename, Arrow's S3
  ``move`` copies one object); the last ``run.keep_checkpoints`` kept; a job resumed from a
  run folder's checkpoint that storage lacks whole (its upload cut) uploads it first (:meth:`RunStorage.catch_up`);
* each step's trajectory-store file, the evaluation responses, ``config.yaml``, with each
  checkpoint the tracker's ``metrics.jsonl``, ``faults.jsonl`` and ``flow_matrix.json``, and at
  the end ``summary.json``, the final models and those three records again (a finished run's whole
  history: the steps after its last checkpoint are in no checkpoint's upload; a stopped run's: its
  deaths since, the one that stopped it among them).

A job started with ``run.resume`` and no local checkpoint first downloads the latest
checkpoint, the config, the metric log and the store files up to that step into its run folder, then
resumes as from a local checkpoint. Ray Train's trainer classes (``TorchTrainer`` and
friends) are not used: they own the training loop of one worker group and report once per
epoch, while a GraftPool step interleaves several models' generation, verification,
exchange and updates under one controller; only their checkpoint and storage layer fits.
"""

from __future__ import annotations

import os
import posixpath
import shutil
from pathlib import Path

import pyarrow.fs as pafs
from ray.train import Checkpoint

from graftpool.redaction import redact_text
from orchestrator.config import ConfigError
from workers.training.node_files import storage_filesystem

TMP_PREFIX = ".tmp-"
STEP_FOLDERS = ("trajectories", "evals")  # one file per step, written as the run goes
WHOLE_OBJECTS = ("s3", "gcs", "abfs")
"""Filesystems (pyarrow's ``type_name``) that write an uploaded file as one object, whole or not at all."""
RUN_RECORDS = ("config.yaml", "metrics.jsonl", "faults.jsonl", "flow_matrix.json", "mlflow.json")
"""The run folder's own files a resumed job takes from storage: the config, and the tracker's metric log,
deaths, flow matrices and ``mlflow.json`` (``dashboards.tracking``; uploaded with each checkpoint, the
first three cut back to its step on the resume as after a local one). ``mlflow.json``'s ``caught_up_step``
is where a resumed job starts sending ``metrics.jsonl``'s values its store lacks: without it, a job resumed
on a new head sent nothing the killed job had left unsent (its store out of reach, values dropped)."""


def open_storage(uri: str | None, run_dir: Path, resume: bool) -> RunStorage | None:
    """The run's storage (None without ``run.storage``); with ``resume`` and no local checkpoint,
    the latest one there is downloaded into ``run_dir`` first (a job on a fresh working copy).

    A fresh run (no ``resume``) whose ``<storage>/<run.name>`` already holds an earlier run's
    checkpoints or store files is refused, as a run folder holding checkpoints is
    (``checkpoint.prepare_run_dir``): its uploads would replace the earlier run's step files,
    ``keep_checkpoints`` would delete its own lower-numbered checkpoints first, and a later
    ``--resume`` would take the earlier run's latest. A storage the driver cannot open, list or
    write (an unknown scheme, no credentials, a missing bucket, a path it may not create) is a
    :class:`ConfigError` naming ``run.storage``, before Ray starts."""
    if not uri:
        return None
    try:  # the first calls on the filesystem: a bad scheme, no credentials, no such bucket fail here
        storage = RunStorage(uri, run_dir.name, run_dir)
        held = [] if resume else storage.checkpoint_names()
        stored_steps = [] if resume else storage._step_files()
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise ConfigError(f"run.storage: the driver cannot use {redact_text(uri)} ({type(exc).__name__}: "
                          f"{redact_text(str(exc))}); expected a folder this node can write, or a pyarrow "
                          "filesystem URI it can write to (file:///..., s3://bucket/prefix with credentials "
                          "on the head, gs://...)") from None
    if not resume and (held or stored_steps):
        what = f"checkpoints (latest {held[-1]})" if held else "store files"
        raise ConfigError(f"run.storage: {redact_text(uri)}/{run_dir.name} holds an earlier run's {what}: "
                          "pass --resume (run.resume=true) to continue it, or choose another run.name")
    if resume and not any((run_dir / "checkpoints").glob("step_*")):
        step = storage.restore_into(run_dir)
        if step is not None:
            print(f"{run_dir.name}: checkpoint of step {step} downloaded from {redact_text(uri)}", flush=True)
        elif not (run_dir / "config.yaml").is_file() and storage._exists(storage._path("config.yaml")):
            # a run without checkpoints (run.checkpoint_every 0): its config, so that prepare_run_dir refuses a
            # resume of another config, whose uploads would replace that run's files in storage
            storage.download("config.yaml", run_dir / "config.yaml")
    return storage


class RunStorage:
    """The run's folder in ``uri`` (``<uri>/<run_name>``) and the copies into and out of it;
    ``run_dir``: the local run folder that :meth:`mirror` copies from."""

    def __init__(self, uri: str, run_name: str, run_dir: Path | None = None):
        self.uri = uri
        self.run_dir = run_dir
        self.fs, base = storage_filesystem(uri)  # a plain path: from the working directory
        self.root = posixpath.join(base, run_name)
        self.local = pafs.LocalFileSystem()
        self.fs.create_dir(self.root, recursive=True)

    def _path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def _exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def upload(self, local: Path, *remote: str) -> None:
        """A file or folder, to ``<root>/<remote...>`` (replacing what is there).

        A file reaches a path storage (a local or NFS folder, ``file://``) whole or not at all: it
        is copied under a ``.tmp-`` name and renamed into place, so a job stopped during the copy
        leaves the earlier version (a resumed job once read a ``flow_matrix.json`` or
        ``metrics.jsonl`` cut short there and failed). An object store writes an object whole
        anyway. A folder's completeness is its caller's (a checkpoint's metadata goes last)."""
        target = self._path(*remote)
        if local.is_dir():
            self.delete(*remote)
            pafs.copy_files(str(local), target, source_filesystem=self.local, destination_filesystem=self.fs)
            return
        folder = posixpath.dirname(target)
        self.fs.create_dir(folder, recursive=True)
        if self.fs.type_name in WHOLE_OBJECTS:
            pafs.copy_files(str(local), target, source_filesystem=self.local, destination_filesystem=self.fs)
            return
        partial = posixpath.join(folder, TMP_PREFIX + posixpath.basename(target))
        pafs.copy_files(str(local), partial, source_filesystem=self.local, destination_filesystem=self.fs)
        self.fs.move(partial, target)

    def mirror(self, local: Path) -> None:
        """Copy a file or folder of the run folder to the same place under the storage root."""
        self.upload(local, *Path(local).resolve().relative_to(Path(self.run_dir).resolve()).parts)

    def mirror_records(self) -> None:
        """The run folder's :data:`RUN_RECORDS` but the config (which the start mirrors), as they stand:
        before each checkpoint's upload and when the run ends. One the folder lacks goes from storage
        too: an earlier run's of the same name (stopped before its first checkpoint), which a resume
        on a new head would otherwise take for this run's (its deaths, its MLflow runs)."""
        for name in RUN_RECORDS[1:]:
            if (self.run_dir / name).is_file():
                self.mirror(self.run_dir / name)
            else:
                self.delete(name)

    def delete(self, *remote: str) -> None:
        target = self._path(*remote)
        info = self.fs.get_file_info(target)
        if info.type == pafs.FileType.Directory:
            self.fs.delete_dir(target)
        elif info.type == pafs.FileType.File:
            self.fs.delete_file(target)

    def list(self, *remote: str) -> list[str]:
        """Names directly under ``<root>/<remote...>`` (empty when it does not exist)."""
        folder = self._path(*remote)
        if not self._exists(folder):
            return []
        return sorted(posixpath.basename(i.path) for i in self.fs.get_file_info(pafs.FileSelector(folder)))

    # -- checkpoints ---------------------------------------------------------------------

    def save_checkpoint(self, local: Path, step: int, keep: int) -> None:
        """Upload checkpoint folder ``local`` as ``checkpoints/step_NNNNNN``, its metadata (the step)
        last, so that only a whole upload is a checkpoint (:meth:`checkpoint_names`), and keep the
        last ``keep``."""
        name = local.name
        self.upload(local, "checkpoints", name)
        Checkpoint(self._path("checkpoints", name), self.fs).set_metadata({"step": step})
        for old in self.checkpoint_names()[:-keep]:
            self.delete("checkpoints", old)
        for stale in self.list("checkpoints"):  # a temporary name an earlier version uploaded under
            if stale.startswith(TMP_PREFIX):
                self.delete("checkpoints", stale)

    def catch_up(self, local: Path, step: int, keep: int) -> bool:
        """Upload checkpoint folder ``local`` (a resumed job's, from its run folder) where storage
        lacks it whole; returns whether it did. A job stopped during a checkpoint's upload left it
        only in the run folder, and a job re-submitted on the same head resumes from there: storage's
        latest stayed the one before until the next save, so a head lost meanwhile cost the steps
        between them, and the cut upload (no metadata) was never among the ones ``keep`` deletes.
        The run's records (:data:`RUN_RECORDS` but the config, which the start mirrors) go first, as
        a checkpoint's save mirrors them before its upload: a job stopped before that mirror left
        storage's metric log at the checkpoint before, and a head lost after this upload resumed from
        it without the steps between (never written again: the log is cut back to the checkpoint)."""
        if local.name in self.checkpoint_names():
            return False
        self.mirror_records()
        self.save_checkpoint(local, step, keep)  # replaces a cut upload of the same name
        return True

    def checkpoint_names(self) -> list[str]:
        """The whole checkpoints in storage, oldest first: ``step_*`` folders with their metadata."""
        names = [n for n in self.list("checkpoints") if n.startswith("step_")
                 and Checkpoint(self._path("checkpoints", n), self.fs).get_metadata()]
        return sorted(names, key=lambda n: int(n.split("_")[1]))

    def restore_into(self, run_dir: Path) -> int | None:
        """Download the latest checkpoint, the :data:`RUN_RECORDS` and the store and evaluation
        files of the steps up to it into ``run_dir``; returns its step, None when storage holds none.

        The checkpoint comes last, into ``checkpoints/.tmp-step_N`` renamed to ``step_N`` once
        whole (as a local save), so a download cut short (a job stopped, a read that failed)
        leaves no ``step_*`` folder: the next resume downloads everything again, instead of
        taking a checkpoint with files missing, or none, and starting at step 0."""
        names = self.checkpoint_names()
        if not names:
            return None
        checkpoint = Checkpoint(self._path("checkpoints", names[-1]), self.fs)
        step = int(checkpoint.get_metadata()["step"])
        for name in RUN_RECORDS:
            if self._exists(self._path(name)):
                self.download(name, run_dir / name)
        for folder, name, file_step in self._step_files():
            if file_step <= step:
                self.download(posixpath.join(folder, name), run_dir / folder / name)
        partial = run_dir / "checkpoints" / f"{TMP_PREFIX}{names[-1]}"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        checkpoint.to_directory(str(partial))
        (partial / ".metadata.json").unlink(missing_ok=True)
        os.replace(partial, run_dir / "checkpoints" / names[-1])
        return step

    def download(self, remote: str, local: Path) -> None:
        """``<root>/<remote>`` to ``local``, whole or not at all: copied under a hidden ``.tmp-`` name
        and renamed, so a job stopped mid-copy leaves no cut ``step_NNNNNN.parquet`` that the store's
        readers (a ``stored`` routing, the dashboards and reports) would open before a resume
        downloads it again (Parquet datasets skip names starting with ".")."""
        local.parent.mkdir(parents=True, exist_ok=True)
        partial = local.with_name(TMP_PREFIX + local.name)
        pafs.copy_files(self._path(remote), str(partial), source_filesystem=self.fs, destination_filesystem=self.local)
        os.replace(partial, local)

    def drop_steps_after(self, step: int) -> int:
        """Store and evaluation files of steps after ``step`` (a run went back to a checkpoint, or
        started again with none); returns how many went."""
        stale = [(folder, name) for folder, name, file_step in self._step_files() if file_step > step]
        for folder, name in stale:
            self.delete(folder, name)
        return len(stale)

    def _step_files(self) -> list[tuple[str, str, int]]:
        """(folder, name, step) of every ``step_NNNNNN.parquet`` of the store and the evaluations."""
        return [(folder, name, int(name.split("_")[1].split(".")[0]))
                for folder in STEP_FOLDERS for name in self.list(folder) if name.startswith("step_")]
