"""A finished run's folder cut back to an earlier checkpoint, for the tests that resume it and
compare the end with the uninterrupted run (``tests/test_precision.py``, ``tests/test_lora.py``):
the uninterrupted run's own checkpoint serves as the stopped run's, so no second run is needed
to stop at it."""

from __future__ import annotations

import shutil
from pathlib import Path


def _step_of(path: Path) -> int:
    """The step in a ``step_NNNNNN...`` file or folder name."""
    return int(path.name.removeprefix("step_")[:6])


def cut_back(out: Path, name: str, step: int, copy: Path) -> Path:
    """``out/name`` copied to ``copy/name`` as it was when the run had written its step-``step``
    checkpoint: the later checkpoints and store files, the summary and the final models gone; the
    MLflow store (``out/mlflow.db``) copied beside it, so that the resumed run logs into the same
    MLflow runs (``run.output_dir`` may change at a resume, the run's name may not). Returns
    ``copy/name``."""
    cut = copy / name
    shutil.copytree(out / name, cut)
    shutil.copy(out / "mlflow.db", copy / "mlflow.db")
    shutil.rmtree(cut / "final")
    (cut / "summary.json").unlink()
    for later in [*(cut / "checkpoints").glob("step_*"), *(cut / "trajectories").glob("step_*")]:
        if _step_of(later) > step:
            shutil.rmtree(later) if later.is_dir() else later.unlink()
    return cut
