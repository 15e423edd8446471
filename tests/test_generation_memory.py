"""The ``hf`` backend's log-probs of sampled tokens are taken during ``generate``, one step's
logits at a time (``workers.rollout.step_logprobs``): ``generate(output_logits=True)`` kept every
step's fp32 logits (256 rows x 4,096 new tokens x 152 k: 637 GB on a GPU)."""

from __future__ import annotations

import torch


def sampled_logprobs(step_logits: tuple[torch.Tensor, ...], tokens: torch.Tensor) -> torch.Tensor:
    """The reference: log softmax(z_t)[y_t] of each sampled token from ``generate``'s kept logits
    (``output_logits=True``, one [rows, V] tensor a step), [rows, steps] in fp32."""
    return torch.stack([torch.log_softmax(z.float(), dim=-1).gather(-1, tokens[:, t, None])[:, 0]
                        for t, z in enumerate(step_logits)], dim=1)


def _tiny_llama(vocab: int, seed: int = 0):
    """A 1-layer Llama of width 8 over ``vocab`` tokens: its logits, not its activations or KV
    cache, are what a generate call's memory is made of."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, head_dim=8, max_position_embeddings=256)
    return LlamaForCausalLM(config).eval()


def test_step_logprobs_equal_those_of_generates_kept_logits_bit_for_bit():
    """The recorder's log-probs are ``sampled_logprobs`` of ``generate``'s own kept logits, in
    the same call: a plain batch (prefill of the whole prompt) and the shared-prompt path (the
    prompt's prefix cached, ``generate`` starting from its last token)."""
    from workers.rollout.generation import shared_prompt_cache
    from workers.rollout.step_logprobs import StepLogprobs

    model = _tiny_llama(300)
    ids = torch.randint(3, 300, (3, 7), generator=torch.Generator().manual_seed(1))
    encoded = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    for n, shared in ((2, False), (4, True)):
        inputs = dict(encoded)
        if shared:
            inputs = {k: v.repeat_interleave(n, dim=0) for k, v in encoded.items()} | \
                shared_prompt_cache(model, encoded, n)
        with torch.no_grad(), StepLogprobs(model) as steps:
            out = model.generate(**inputs, do_sample=True, top_k=0, num_return_sequences=1 if shared else n,
                                 max_new_tokens=12, eos_token_id=2, pad_token_id=0, output_logits=True,
                                 return_dict_in_generate=True)
        new = out.sequences[:, ids.shape[1]:]
        assert torch.equal(steps.logprobs(new), sampled_logprobs(out.logits, new)), (n, shared)


def test_an_hf_rollout_keeps_no_steps_logits():
    """``sample_completions``, 16 rows x 128 new tokens on a 400-token vocabulary: the ``generate``
    call it makes returns no logits. With ``output_logits=True`` it returned every step's, 3.3 MB
    here, all held until the log-probs were taken (at 256 rows x 4,096 tokens x 151,936: 637 GB
    on a GPU); the log-probs are the same (the test above)."""
    from tests.llama3_style import llama3_tokenizer
    from workers.rollout.generation import SamplingParams, sample_completions

    tokenizer = llama3_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token
    model = _tiny_llama(len(tokenizer))
    returned = []
    generate = model.generate

    def generate_and_keep(*args, **kwargs):  # the real generate; what it returns is looked at
        out = generate(*args, **kwargs)
        returned.append(out)
        return out

    model.generate = generate_and_keep
    torch.manual_seed(0)
    done = sample_completions(model, tokenizer, ["13+29=", "7-5=", "9 mod 4=", "2+2="],
                              SamplingParams(4, 1.0, 1.0, 128), chat_template="none")
    assert max(len(ids) for c in done for ids in c.token_ids) > 64
    assert len(returned) == 1
    kept = sum(t.numel() * t.element_size() for t in returned[0].get("logits") or ())
    assert kept == 0, f"generate returned {kept} bytes of logits"


def test_generate_calls_from_two_threads_each_get_their_own_tokens_log_probs():
    """A served deployment runs concurrent requests in threads on one model; the recorder's hook
    sees every forward of the model, so without one recorder at a time each call's log-probs mix
    the other's forwards (``serve``'s chat completions failed with HTTP 500). Two threads, six
    ``generate`` calls each (row counts differ), every call's log-probs equal to its own kept
    logits'."""
    import threading

    from workers.rollout.step_logprobs import StepLogprobs

    model = _tiny_llama(300)
    ids = torch.randint(3, 300, (2, 5), generator=torch.Generator().manual_seed(2))
    start, failures = threading.Barrier(2), []

    def calls(copies: int) -> None:
        start.wait()
        for _ in range(6):
            try:
                with torch.no_grad(), StepLogprobs(model) as steps:
                    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0,
                                         num_return_sequences=copies, max_new_tokens=16, eos_token_id=2,
                                         pad_token_id=0, output_logits=True, return_dict_in_generate=True)
                new = out.sequences[:, ids.shape[1]:]
                if not torch.equal(steps.logprobs(new), sampled_logprobs(out.logits, new)):
                    failures.append(f"{copies}: log-probs differ")
            except Exception as error:  # noqa: BLE001 - a hook fed the other call's forward
                failures.append(f"{copies}: {error!r}")

    threads = [threading.Thread(target=calls, args=(copies,)) for copies in (1, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures



def test_sample_completions_from_two_threads_each_get_their_own_rows(paths):
    """``graftpool serve``'s ``hf`` deployment runs concurrent requests in threads on one model, and
    ``sample_completions`` prefills each prompt once for its n samples (``shared_prompt_cache``): a
    forward outside ``generate`` that another thread's recorder took for one of its decoding steps
    (``eval --endpoint`` against ``make serve`` got HTTP 500: "Size does not match ... [4, 1] ...
    [1, 100]"). Two threads, greedy, other rows a call: each call's tokens and log-probs are those
    of the same call made alone."""
    import threading

    import numpy as np

    from workers.rollout.generation import HFGeneration, SamplingParams, sample_completions

    generator = HFGeneration(paths["gpt2-bpe"])
    model, tokenizer = generator.model, generator.tokenizer
    calls_of = {"one prompt": (["13+29="], SamplingParams(n=4, temperature=0.0, max_new_tokens=24)),
                "three prompts": (["7-5=", "9 mod 4=", "2+2="], SamplingParams(n=2, temperature=0.0, max_new_tokens=24))}
    alone = {name: sample_completions(model, tokenizer, *call) for name, call in calls_of.items()}
    start, failures = threading.Barrier(2), []

    def calls(name: str) -> None:
        start.wait()
        for _ in range(6):
            try:
                got = sample_completions(model, tokenizer, *calls_of[name])
            except Exception as error:  # noqa: BLE001 - a recorder fed the other call's forward
                failures.append(f"{name}: {error!r}")
                continue
            for mine, theirs in zip(got, alone[name], strict=True):
                if mine.token_ids != theirs.token_ids or not all(
                        np.allclose(a, b, atol=1e-5) for a, b in zip(mine.logprobs, theirs.logprobs, strict=True)):
                    failures.append(f"{name}: other tokens or log-probs than alone")

    threads = [threading.Thread(target=calls, args=(name,)) for name in calls_of]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
