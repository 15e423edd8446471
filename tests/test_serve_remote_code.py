"""``graftpool serve`` loads a final model as the run loaded it: a model with code of its own
(``auto_map`` in its ``config.json``, ``models[].trust_remote_code: true``) is saved with that code in
``final/<model>``, and transformers loads it only with ``trust_remote_code=True``. The run's
replicas, trainers and ``graftpool eval`` take the flag from the config; serve took only
``chat_template`` from it, so its deployment failed at start ("contains custom code which must be
executed") and the run could not be served at all, with no option to say otherwise.

The model folder is the Llama-3-style one (``tests/llama3_style.py``) under a model type of its own,
its config and model classes in the folder, as a hub repository with custom code lays them out;
the run folder is the demo's (``tests/served_run.py``), served in this process."""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

import yaml

from tests.llama3_style import build_llama3_style
from tests.netcut import free_port
from tests.served_run import served_run_folder

CONFIGURATION = ("from transformers import LlamaConfig\n\n\n"
                 "class RemoteLlamaConfig(LlamaConfig):\n    model_type = 'remote_llama'\n")
MODELING = ("from transformers import LlamaForCausalLM\n\nfrom .configuration_remote import RemoteLlamaConfig\n\n\n"
            "class RemoteLlamaForCausalLM(LlamaForCausalLM):\n    config_class = RemoteLlamaConfig\n")


def build_remote_code_model(folder: Path) -> Path:
    """A model folder that transformers loads only with ``trust_remote_code=True``."""
    build_llama3_style(folder)
    config = json.loads((folder / "config.json").read_text())
    config |= {"model_type": "remote_llama", "architectures": ["RemoteLlamaForCausalLM"],
               "auto_map": {"AutoConfig": "configuration_remote.RemoteLlamaConfig",
                            "AutoModelForCausalLM": "modeling_remote.RemoteLlamaForCausalLM"}}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "configuration_remote.py").write_text(CONFIGURATION)
    (folder / "modeling_remote.py").write_text(MODELING)
    return folder


def test_a_run_trained_with_trust_remote_code_is_served(tmp_path):
    from ray import serve

    from orchestrator.serving.serve import start_serving

    run_dir = served_run_folder(tmp_path, "remote", ["models.0.trust_remote_code=true"])
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["models"][0]["trust_remote_code"] is True
    shutil.rmtree(run_dir / "final" / "llama-char")
    build_remote_code_model(run_dir / "final" / "llama-char")
    port = free_port()
    start_serving(run_dir, port)
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", method="POST", headers={"Content-Type": "application/json"},
            data=json.dumps({"model": "llama-char", "prompt": "13+29=", "max_tokens": 4, "temperature": 0}).encode())
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=120) as reply:
            answer = json.loads(reply.read())
        assert len(answer["choices"]) == 1 and answer["usage"]["completion_tokens"] >= 1, answer
    finally:
        serve.shutdown()
