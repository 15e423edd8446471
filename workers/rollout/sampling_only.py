"""The ``hf`` backend samples from what the config says, not from the model folder's own
sampling defaults.

transformers' ``generate`` starts from the model's ``generation_config.json`` and lets the call's
arguments override the fields they name; every other field of that file still shapes the
distribution. An instruct model's file often holds more than temperature and top-p:
Qwen2.5-1.5B-Instruct's sets ``repetition_penalty: 1.1`` (others ``no_repeat_ngram_size``,
``min_p``, ``typical_p``, ``suppress_tokens``, ...). Left in, a response is drawn from

    p'(y_t) proportional to exp(z'_t / T) with z'_t,v = z_t,v / 1.1 (z > 0) or z_t,v * 1.1 (z < 0)
    for every token v already in the prompt or the response,

not from pi(y_t) = softmax(z_t / T) that GRPO's ratio, the recorded behaviour log-probs and the
gate take it to come from; and the same config samples differently under ``vllm``, whose
engine is given an explicit ``SamplingParams`` and applies none of the file's defaults. verl and
TRL likewise pass the penalty themselves (1.0 unless configured).

:func:`sampling_only` blanks the model's generation config for one ``generate`` call, so the
distribution is softmax(z / temperature) cut by top-p alone: what ``models[].generation`` names.
The stop ids are read from the file before (``workers.rollout.chat.stop_token_ids``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from transformers import GenerationConfig


@contextmanager
def sampling_only(model) -> Iterator[None]:
    """``model.generation_config`` replaced by an empty one for the block (the caller passes every
    setting it samples with), then restored. Call it inside the model's turn
    (``workers.rollout.step_logprobs.model_turn``): another thread's ``generate`` would see it."""
    kept = getattr(model, "generation_config", None)
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = kept
