"""``graftpool serve``'s chat route conditions a model on the ids training gave it.

A Llama-3 tokenizer adds ``<|begin_of_text|>`` itself (its post-processor) and its chat template
writes one too. Training renders the template and tokenizes without special tokens
(``workers.rollout.chat.prompt_ids``): one BOS. The served model's backend takes prompts as a
completions request does, with the tokenizer's special tokens, so a rendered chat reached it with
two BOS, a prompt the model never saw in training (and ``graftpool eval --endpoint`` scored
answers to it). The model folder is built here (``tests/llama3_style.py``) with Meta's BOS
post-processor added; the server class runs in this process (the ``hf`` backend on CPU), as a
Serve replica runs it."""

from __future__ import annotations

from pathlib import Path

from tokenizers import processors
from transformers import AutoTokenizer

from tests.llama3_style import BOS, build_llama3_style


def _llama3_with_bos(folder: Path) -> Path:
    """The Llama-3-style folder, its tokenizer adding BOS as Meta's ``tokenizer.json`` does."""
    build_llama3_style(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    bos = tokenizer.convert_tokens_to_ids(BOS)
    tokenizer._tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS}:0 $A:0", pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1", special_tokens=[(BOS, bos)])
    tokenizer.save_pretrained(folder)
    return folder


def test_a_served_chat_prompt_has_the_trained_ids_with_one_bos(tmp_path):
    from orchestrator.serving.serve import ModelServer
    from workers.rollout.chat import prompt_ids
    from workers.rollout.generation import HFGeneration, SamplingParams

    folder = _llama3_with_bos(tmp_path / "llama3")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    bos = tokenizer.convert_tokens_to_ids(BOS)
    assert tokenizer("1+2=")["input_ids"][0] == bos, "the tokenizer adds BOS, as Llama 3's"
    prompt = "13+29= Answer in \\boxed{}."
    trained = prompt_ids(tokenizer, prompt, "auto")
    assert trained.count(bos) == 1

    server = ModelServer.func_or_class("llama3", str(folder), "auto")  # as a Serve replica builds it
    served = server.render([{"role": "user", "content": prompt}])
    assert tokenizer(served)["input_ids"] == trained, "what the backend tokenizes is what training did"
    answer = server.complete([served], 1, 0.0, 1.0, 8)[0]
    local = HFGeneration(folder, chat_template="auto").generate([prompt], SamplingParams(1, 0.0, 1.0, 8))[0]
    assert answer["texts"] == local.responses and answer["prompt_tokens"] == len(trained)


def test_a_served_base_models_chat_response_ends_at_its_templates_turn_end(tmp_path):
    """The served model stops where the run stopped it: a prompt arrives rendered, so the backend
    renders none (``chat_template: none``), yet a base model trained under its chat template ends
    its answers with the template's turn end (``<|eot_id|>``), which its files do not name as EOS.
    ``tests/test_turn_end.py``'s model greedily emits it: one token and finished, as the run's own
    evaluation samples it, not ``max_tokens`` of it unfinished (the answer text running on past
    the turn that ``eval --endpoint`` then judged)."""
    from orchestrator.serving.serve import ModelServer
    from tests.llama3_style import build_llama32_base
    from workers.rollout.generation import HFGeneration, SamplingParams

    folder = build_llama32_base(tmp_path / "llama32-base", emits_turn_end=True)
    server = ModelServer.func_or_class("llama32", str(folder), "auto")
    served = server.complete([server.render([{"role": "user", "content": "12+35="}])], 2, 0.0, 1.0, 6)[0]
    run = HFGeneration(folder, chat_template="auto").generate(["12+35="], SamplingParams(2, 0.0, 1.0, 6))[0]
    assert run.finished == [True, True] and [len(ids) for ids in run.token_ids] == [1, 1]
    assert served["finished"] == run.finished and served["tokens"] == [1, 1]
