"""``graftpool eval RUN_DIR --endpoint URL``: a run's eval sets scored through an
OpenAI-compatible endpoint (``graftpool serve``, or any server that serves the run's model
names), instead of Ray actors loading the final weights.

Each prompt goes as one chat request (``/chat/completions``: the server renders it with the
model's chat template, as training did) with ``n = eval.samples``, the eval temperature and
top-p, and the model's ``generation.max_new_tokens``; the answers are verified here with the
run's verifier, under the run's ``data.verifier_timeout_s`` and response cap (as its actors
judge). pass@1 per set is the mean over prompts of the share of samples that are successes
(``graftpool.contracts.pass_at_1``: reward above 0.5), and ``avg``
the mean over sets (as ``Controller.evaluate``). Writes ``eval_endpoint.json`` in the
run folder. Only the standard library speaks HTTP here.
"""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from graftpool.contracts import pass_at_1
from graftpool.redaction import redact_text
from orchestrator.config import ConfigError
from orchestrator.config.final_models import final_models_config
from orchestrator.controller.prompts import load_data, verifier_query
from workers.verify.verifier import make_verifier, verify_many


def _post(url: str, payload: dict, timeout_s: float = 600.0) -> dict:
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy hop
    try:
        with opener.open(request, timeout=timeout_s) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        raise ConfigError(redact_text(f"{url}: HTTP {exc.code}: {exc.read().decode(errors='replace')[:500]}")) from None


def evaluate_endpoint(run_dir: Path, endpoint: str, overrides: list[str] | None = None,
                      concurrency: int = 8) -> dict[str, dict[str, float]]:
    # as `graftpool eval` reads it: the final models, no backend asked for (the server generates), so a
    # folder copied back from a cluster is scored where the head's model folders and packages are not
    config = final_models_config(run_dir, overrides, generates=False)
    _, eval_sets = load_data(config.data.train, config.data.eval, config.run.seed)
    if not eval_sets:
        raise ConfigError("data.eval: the run has no eval sets")
    # judged as the run judges (Controller.verifier_pool): its per-answer limit and response cap
    verifier = make_verifier(config.data.verifier, **config.verifier_params)
    url = endpoint.rstrip("/") + "/chat/completions"
    ev = config.eval
    scores: dict[str, dict[str, float]] = {}
    with ThreadPoolExecutor(concurrency) as pool:
        for model in config.models:
            scores[model.name] = {}
            for set_name, problems in eval_sets.items():
                problems = problems[: ev.max_prompts] if ev.max_prompts else problems
                payloads = [{"model": model.name, "messages": [{"role": "user", "content": p.prompt}],
                             "n": ev.samples, "temperature": ev.temperature, "top_p": ev.top_p,
                             "max_tokens": model.generation.max_new_tokens} for p in problems]
                replies = list(pool.map(lambda body: _post(url, body), payloads))
                rewards = [[v.reward for v in verify_many(verifier, [verifier_query(p, choice["message"]["content"])
                                                                     for choice in reply["choices"]])]
                           for p, reply in zip(problems, replies, strict=True)]
                scores[model.name][set_name] = pass_at_1(rewards)
            scores[model.name]["avg"] = float(np.mean(list(scores[model.name].values())))
    (run_dir / "eval_endpoint.json").write_text(json.dumps({"endpoint": redact_text(endpoint), "scores": scores},
                                                           indent=2))
    return scores
