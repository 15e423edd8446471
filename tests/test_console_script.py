"""The ``graftpool`` console script imports from the working directory as ``python -m
orchestrator`` does (issue #51's thirty-seventh read): its ``sys.path[0]`` is the venv's ``bin``
folder, so a reward plugin ``python:my_rewards:score`` in the working directory, accepted under
``python -m orchestrator``, was refused at load ("no module 'my_rewards' on the Python path"), and a
registry's ``lazy`` module there was not found in the driver once the actors had started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(sys.executable).parent / "graftpool"


@pytest.mark.skipif(not SCRIPT.is_file(), reason="the graftpool console script is not installed in this venv")
def test_the_console_script_finds_a_reward_plugin_module_of_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "my_rewards.py").write_text(
        "def score(question, response, answer, metadata):\n    return float(answer in response)\n")
    config = yaml.safe_load((ROOT / "configs" / "demo_pair.yaml").read_text())
    config["data"]["verifier"] = "python:my_rewards:score"
    (tmp_path / "plugin_pair.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's code, not the working directory
    # `build` loads the config whole (data.verifier checked) and builds its tiny models (cached)
    done = subprocess.run([str(SCRIPT), "build", "plugin_pair.yaml"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "my_rewards" not in done.stderr
