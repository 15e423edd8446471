"""Each model's own view of a prompt: its chat template, its token ids, its stop tokens.

The controller sends every model the same plain prompt (the question plus the instruction).
A model with ``models[].chat_template: auto`` whose tokenizer has a chat template renders it
as one user turn with the generation prompt appended; ``none`` (or a tokenizer without a
template: the zoo's) keeps the plain string. Generation and the trainer both go through
:func:`prompt_ids`, so a grafted response is scored and trained under the RECEIVER's rendering
of the prompt, never the donor's.
"""

from __future__ import annotations

from collections.abc import Sequence

TEMPLATE_MODES = ("auto", "none")

# What every render of a chat template is given. Llama 3.x's templates write a date into the system
# turn, today's (``strftime_now("%d %b %Y")``) unless ``date_string`` is given: rendered by the
# clock, a step that straddles midnight samples, scores (pi_old) and trains one prompt under two
# dates, so its ratios leave 1 by what the date line moves the log-probs, and a run resumed on a
# later day conditions on other tokens than the run it continues. Fixed to those templates' own
# fallback date, every render (generation, trainer, serve) of every run is the same text.
TEMPLATE_VARIABLES = {"date_string": "26 Jul 2024"}


def uses_template(tokenizer, mode: str) -> bool:
    if mode not in TEMPLATE_MODES:
        raise ValueError(f"models[].chat_template: expected one of {list(TEMPLATE_MODES)}, got {mode!r}")
    return mode == "auto" and bool(getattr(tokenizer, "chat_template", None))


def render_prompt(tokenizer, prompt: str, mode: str = "auto") -> str:
    """The text the model is conditioned on: the chat-rendered user turn plus the assistant's
    generation prompt, or ``prompt`` itself."""
    if not uses_template(tokenizer, mode):
        return prompt
    return render_messages(tokenizer, [{"role": "user", "content": prompt}])


def render_messages(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """``messages`` through the tokenizer's chat template, with :data:`TEMPLATE_VARIABLES`, as text."""
    return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False,
                                         **TEMPLATE_VARIABLES)


def encode_kwargs(tokenizer, mode: str) -> dict:
    """Tokenizer arguments for a (rendered) prompt: a rendered template already holds its
    special tokens (BOS, turn markers), so none are added on top."""
    return {"add_special_tokens": False} if uses_template(tokenizer, mode) else {}


def prompt_ids(tokenizer, prompt: str, mode: str = "auto") -> list[int]:
    """Token ids of the model's rendering of ``prompt``."""
    return tokenizer(render_prompt(tokenizer, prompt, mode), **encode_kwargs(tokenizer, mode))["input_ids"]


def without_template_bos(tokenizer, rendered: str) -> str:
    """A chat-rendered prompt as a plain prompt must be given to a backend that tokenizes with
    the tokenizer's special tokens (``models[].chat_template: none``, a completions request):
    where the tokenizer adds a BOS itself and the template wrote one too (Llama 3:
    ``{{ bos_token }}`` and a ``<|begin_of_text|>`` post-processor), the template's is dropped, so
    the ids are those training used (:func:`prompt_ids`), not two BOS. Else ``rendered``."""
    bos = tokenizer.bos_token
    if not bos or not rendered.startswith(bos):
        return rendered
    trained = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    if tokenizer(rendered)["input_ids"] == trained:
        return rendered
    stripped = rendered[len(bos):]
    return stripped if tokenizer(stripped)["input_ids"] == trained else rendered


def with_stops(stops: Sequence[int], extra: Sequence[int]) -> list[int]:
    """A backend's stop ids (:func:`stop_token_ids`) and a call's own (``SamplingParams.stop_token_ids``:
    ``graftpool serve``'s turn end), each once, in that order."""
    return list(dict.fromkeys([*stops, *extra]))


TURN_PROBE = "graftpool-turn-probe"  # an assistant message's text, to find what the template writes after it


def turn_end_id(tokenizer) -> int | None:
    """The special token the chat template writes to close an assistant turn (ChatML's
    ``<|im_end|>``, Llama 3's ``<|eot_id|>``), found by rendering a user turn and an assistant
    turn and tokenizing what follows the assistant's text; None where no special token follows
    (or the template refuses the exchange)."""
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": TURN_PROBE}]
    try:
        rendered = render_messages(tokenizer, messages, add_generation_prompt=False)
    except Exception:  # noqa: BLE001 - a template with its own rules about turns: no end to find
        return None
    at = rendered.find(TURN_PROBE)
    tail = rendered[at + len(TURN_PROBE):].lstrip() if at >= 0 else ""
    ids = tokenizer(tail, add_special_tokens=False)["input_ids"] if tail else []
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    return ids[0] if ids and ids[0] in special else None


def stop_token_ids(tokenizer, generation_config=None, mode: str = "none") -> list[int]:
    """Where a response ends: the tokenizer's EOS, every ``eos_token_id`` of the model's
    generation config (an instruct model's end-of-turn token, e.g. ``<|im_end|>``), and where the
    prompt is rendered with the chat template (``mode``, :func:`uses_template`) the token that
    template closes an assistant turn with (:func:`turn_end_id`): a base model's files name only
    ``<|endoftext|>`` (Qwen2.5) or ``<|end_of_text|>`` (Llama 3.2), and without it a response
    would run on past the end of its turn to ``max_new_tokens``."""
    ids = [tokenizer.eos_token_id]
    configured = getattr(generation_config, "eos_token_id", None)
    if configured is not None:
        ids += list(configured) if isinstance(configured, list | tuple) else [configured]
    if uses_template(tokenizer, mode):
        ids.append(turn_end_id(tokenizer))
    return list(dict.fromkeys(int(i) for i in ids if i is not None))
