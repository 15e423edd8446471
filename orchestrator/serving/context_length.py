"""A served model's context and the response length a request gets within it (issue #51's
thirty-third read): OpenAI's and vLLM's servers answer a length past the context with a 400
(``context_length_exceeded``); the ``hf`` backend has no bound of its own (its cache reserved
prompt + max_tokens positions a row at the first token, and it sampled past the model's
positions)."""

from __future__ import annotations

import sys

EMPTY_PROMPT = ("the prompt is empty: it has no tokens to sample from (a completion's 'prompt', or the chat's "
                "last user message for a model without a chat template)")


def context_tokens(backend) -> int:
    """The most tokens a row (prompt + response) holds: a vLLM engine's ``max_model_len``, else the
    model's position limit (its text config's ``max_position_embeddings``, GPT-2's ``n_positions``;
    a config that names none, as a model without learned or rotary positions: no limit)."""
    llm = getattr(backend, "llm", None)
    if llm is not None:
        return int(llm.llm_engine.model_config.max_model_len)
    config = backend.model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = getattr(config, "max_position_embeddings", None)
    return int(limit) if limit else sys.maxsize


def fit_length(context: int, longest_prompt: int, max_tokens: int, asked: bool) -> int | str:
    """The response length within a context of C tokens, with P = ``longest_prompt`` tokens:
    ``max_tokens`` where P + max_tokens <= C; a length the request did not ask (the route's
    default) cut to C - P; else why not, which the router answers with a 400."""
    room = context - longest_prompt
    if max_tokens <= room:
        return max_tokens
    if not asked and room >= 1:
        return room
    return (f"this model's maximum context length is {context} tokens; the prompt has {longest_prompt} and "
            f"{max_tokens} were asked for the completion: ask for at most {max(room, 0)}")
