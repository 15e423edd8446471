"""A second ``graftpool serve`` on a Ray instance that already serves a run (two runs served at
once on one cluster, as operations.md's ``RAY_ADDRESS=auto graftpool serve ...`` on the head).
Ray Serve has one application of a name and one HTTP port per cluster: the second serve's port
was ignored (Serve's own warning, "The new HTTP config is ignored.") and its ``serve.run``
replaced the first run's application, so it printed an endpoint on a port where nothing listened
while the first run's endpoint answered with the second run's models under the same names
(issue #51's thirty-ninth read, half b). A second serve is now refused and the first left as it was.

Two finished run folders of one demo model (CPU), served in this process on one local instance,
which is what the cluster's Serve is to both."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.netcut import free_port
from tests.served_run import served_run_folder


def _models(port: int) -> list[str]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{port}/v1/models", timeout=30) as reply:
        return [m["id"] for m in json.loads(reply.read())["data"]]


def test_a_second_serve_on_the_same_cluster_is_refused_and_the_first_left_serving(tmp_path):
    from ray import serve

    from orchestrator.serving.serve import start_serving

    first, second = served_run_folder(tmp_path, "first"), served_run_folder(tmp_path, "second")
    port = free_port()
    start_serving(first, port)
    try:
        with pytest.raises(RuntimeError, match="already serves an application 'graftpool'"):
            start_serving(second, free_port())
        assert _models(port) == ["llama-char"]
    finally:
        serve.shutdown()
