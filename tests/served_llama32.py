"""A run folder with one Llama-3.2-base-shaped model, served by ``graftpool serve`` on 127.0.0.1 and
reached with the openai client: ``tests/test_serve_openai.py``'s app, started once for its tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.llama3_style import build_llama32_base

NEW_TOKENS = 24  # the run's max_new_tokens: a served chat answer's default length


def llama32_run_folder(root: Path) -> Path:
    """A run folder as ``graftpool serve`` reads it: ``config.yaml`` and ``final/<model>``. The
    Llama-3.2-base-shaped model runs greedily past 24 tokens without a stop token."""
    run_dir = root / "runs" / "served"
    build_llama32_base(run_dir / "final" / "llama32")
    config = {"models": [{"name": "llama32", "chat_template": "auto",
                          "generation": {"max_new_tokens": NEW_TOKENS, "num_gpus": 0}}]}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    return run_dir


@contextlib.contextmanager
def served_client(root: Path) -> Iterator:
    """An openai client (no retries) of ``llama32_run_folder(root)`` served on a free loopback port;
    the Serve app is shut down after."""
    from openai import OpenAI
    from ray import serve

    from orchestrator.serving.serve import start_serving
    from tests.netcut import free_port

    url = start_serving(llama32_run_folder(root), free_port())
    try:
        yield OpenAI(base_url=url, api_key="unused", max_retries=0)
    finally:
        serve.shutdown()
