"""``graftpool eval RUN_DIR --endpoint URL``: a run's eval sets scored through an
OpenAI-compatible endpoint (``graftpool serve``, or any server that serves the run's model
names), instead of Ray actors loading the final weights.

Each prompt goes as one chat request (``/chat/completions``: the server renders it with the
model's chat template, as training did) with ``n = eval.samples``, the eval temperature and
top-p, and the response length the run's own evaluation samples it at (:func:`response_lengths`:
the model's ``generation.max_new_tokens``, cut to the room its vLLM engine's ``max_model_len``
leaves the prompt); the answers are verified here with the
run's verifier, under the run's ``data.verifier_timeout_s`` and response cap (as its actors
judge). pass@1 per set is the mean over prompts of the share of samples that are successes
(``graftpool.contracts.pass_at_1``: reward above 0.5), and ``avg``
the mean over sets (as ``Controller.evaluate``). Writes ``eval_endpoint.json`` in the
run folder. Only the standard library speaks HTTP here.
"""

from __future__ import annotations

import json
import urllib.request
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from graftpool.contracts import pass_at_1
from graftpool.redaction import redact_text
from graftpool.tasks import Problem
from orchestrator.config import ConfigError, ModelConfig
from orchestrator.config.final_models import final_models_config
from orchestrator.controller.prompt_lengths import engine_limit, too_long
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


def response_lengths(model: ModelConfig, problems: Sequence[Problem]) -> list[int]:
    """The ``max_tokens`` of each prompt's request: what the run's own evaluation samples it at.

    A row of a vLLM engine ends at ``max_model_len`` L tokens, prompt included, so the run's replica
    gives a prompt of P tokens (rendered as it renders it) min(M, L - P) new tokens, M being
    ``generation.max_new_tokens`` (the start-up checked P <= L - 1). A server answers a request for
    P + M > L tokens with a 400 (vLLM's and ``graftpool serve``'s ``context_length_exceeded``), so
    asking M of every prompt failed the whole evaluation at the first prompt over L - M tokens,
    which the run's evaluation scores. M where the model has no ``max_model_len``, or where its
    tokenizer is not on this machine (said in a warning: the server then refuses such prompts)."""
    most, cap = engine_limit(model), model.generation.max_new_tokens
    if most is None:
        return [cap] * len(problems)
    from orchestrator.models import model_tokenizer

    try:  # the folder's final/<model> (final_models_config), else a local path: nothing built or downloaded
        if model.path is None or not model.path.exists():
            raise ConfigError(f"no local folder at {model.path or 'its builder'}")
        tokenizer = model_tokenizer(model, model.path)
    except (ConfigError, OSError, ValueError) as exc:
        warnings.warn(f"models.{model.name}: no tokenizer here ({exc}); every request asks for "
                      f"{cap} new tokens, which a server refuses for a prompt over {most + 1 - cap} tokens "
                      "(the run's engine cut those responses at its max_model_len)", stacklevel=2)
        return [cap] * len(problems)
    longer = dict(too_long(problems, tokenizer, model.chat_template, most + 1 - cap))  # P + M > L
    return [min(cap, most + 1 - longer[p.prompt_id]) if p.prompt_id in longer else cap for p in problems]


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
                             "max_tokens": length} for p, length in zip(problems, response_lengths(model, problems),
                                                                        strict=True)]
                replies = list(pool.map(lambda body: _post(url, body), payloads))
                rewards = [[v.reward for v in verify_many(verifier, [verifier_query(p, choice["message"]["content"])
                                                                     for choice in reply["choices"]])]
                           for p, reply in zip(problems, replies, strict=True)]
                scores[model.name][set_name] = pass_at_1(rewards)
            scores[model.name]["avg"] = float(np.mean(list(scores[model.name].values())))
    (run_dir / "eval_endpoint.json").write_text(json.dumps({"endpoint": redact_text(endpoint), "scores": scores},
                                                           indent=2))
    return scores
