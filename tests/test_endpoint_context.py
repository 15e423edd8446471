"""``graftpool eval RUN_DIR --endpoint URL`` of a run whose vLLM engine has a ``max_model_len``
(the GPU template's 5,120 with 4,096 new tokens): the run's own evaluation samples a prompt of P
tokens with min(max_new_tokens, max_model_len - P) new tokens (the engine ends a row at
``max_model_len``), and a server answers a request for more than its context with a 400
(vLLM's server and ``graftpool serve`` alike), so ``--endpoint`` must ask each prompt for what the
run sampled it at, not ``max_new_tokens`` whatever the prompt.

The endpoint is a plain OpenAI-compatible HTTP server on 127.0.0.1 that renders each chat
message with the run's final model's tokenizer, as ``graftpool serve`` does, and fits the length
with serve's own ``context_length.fit_length``; the final model is the demo's built llama-char."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.config import load_config
from orchestrator.controller.prompts import load_data
from orchestrator.models import resolve_model_path
from orchestrator.serving.context_length import fit_length
from orchestrator.serving.endpoint_eval import evaluate_endpoint
from tests.chat_endpoint import boxed_choices, chat_endpoint
from workers.rollout.chat import prompt_ids
from workers.rollout.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
NEW_TOKENS = 32


def _fitted(tokenizer, context: int, asked: list[tuple[int, int]]):
    """A server's answer for one model with ``context`` tokens a row; ``asked`` gets (P, max_tokens) a request."""

    def answer(body: dict) -> tuple[int, dict]:
        tokens = len(prompt_ids(tokenizer, body["messages"][-1]["content"], "auto"))
        asked.append((tokens, body["max_tokens"]))
        fitted = fit_length(context, tokens, body["max_tokens"], asked=True)
        if isinstance(fitted, str):
            return 400, {"error": {"message": fitted, "code": "context_length_exceeded"}}
        return 200, boxed_choices(body)

    return answer


def test_endpoint_eval_asks_each_prompt_for_the_length_the_runs_engine_sampled(tmp_path):
    config = yaml.safe_load((ROOT / "configs" / "demo_pair.yaml").read_text())
    config["exchange"], config["models"] = {"name": "none"}, config["models"][:1]
    config["data"]["eval"] = config["data"]["eval"][:1]
    config["eval"] = {"samples": 2, "max_prompts": 16}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    loaded = load_config(run_dir / "config.yaml")
    model = loaded.models[0]
    (run_dir / "final").mkdir()
    (run_dir / "final" / model.name).symlink_to(Path(resolve_model_path(model)).resolve())
    tokenizer = load_tokenizer(run_dir / "final" / model.name)
    prompts = load_data(loaded.data.train, loaded.data.eval, loaded.run.seed)[1][loaded.data.eval[0].name][:16]
    lengths = [len(prompt_ids(tokenizer, p.prompt, "auto")) for p in prompts]
    context = max(lengths) + 4  # every prompt fits (the run's start-up check); the longest leave 4 tokens
    assert min(lengths) + NEW_TOKENS > context  # every prompt's row is cut by the engine
    generation = {"backend": "vllm", "max_new_tokens": NEW_TOKENS, "vllm": {"max_model_len": context}}
    config["models"][0]["generation"] = {**config["models"][0].get("generation", {}), **generation}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))

    asked: list[tuple[int, int]] = []
    with chat_endpoint(_fitted(tokenizer, context, asked)) as url:
        scores = evaluate_endpoint(run_dir, url)
    assert list(scores[model.name]) == [loaded.data.eval[0].name, "avg"]  # every prompt answered, none refused
    assert sorted(asked) == sorted((p, min(NEW_TOKENS, context - p)) for p in lengths)
