"""The in-place KV cache of the hf backend (workers.rollout.kv_cache): it holds what
transformers' concatenating cache holds, through every cache operation generate uses, without
reallocating within its reserved room; sampling with it draws the same tokens and log-probs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.cache_utils import DynamicLayer

from graftpool.tasks import generate_problems
from workers.rollout.generation import HFGeneration, SamplingParams
from workers.rollout.kv_cache import GrowingLayer


def _states(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2, length, 4, generator=g), torch.randn(batch, 2, length, 3, generator=g)


def _same(growing: GrowingLayer, reference: DynamicLayer) -> None:
    assert torch.equal(growing.keys, reference.keys) and torch.equal(growing.values, reference.values)
    assert growing.get_seq_length() == reference.get_seq_length()


def test_growing_layer_holds_what_the_concatenating_layer_holds():
    """Prefill, appends, a repeat to n samples, a crop, a batch selection and growth past the
    reserved room: after each, keys and values equal DynamicLayer's (same ops, same data)."""
    growing, reference = GrowingLayer(capacity=12), DynamicLayer()
    seed = 0

    def append(batch: int, length: int) -> None:
        nonlocal seed
        seed += 1
        keys, values = _states(batch, length, seed)
        out = growing.update(keys, values)
        assert all(torch.equal(a, b) for a, b in zip(out, reference.update(keys, values), strict=True))
        _same(growing, reference)

    append(3, 5)  # the prompts' prefill
    for layer in (growing, reference):
        layer.batch_repeat_interleave(2)  # each prompt's cache copied to its samples
    _same(growing, reference)
    buffer = growing._key_buffer
    assert buffer.shape[-2] == 12  # the repeat already reserved the whole room
    for _ in range(6):  # decoding: one token per step, written in place
        append(6, 1)
    assert growing._key_buffer is buffer and growing.get_seq_length() == 11  # no reallocation in its room
    for layer in (growing, reference):
        layer.crop(-2)
    append(6, 1)
    for layer in (growing, reference):
        layer.batch_select_indices(torch.tensor([0, 2, 5]))
    append(3, 1)
    for _ in range(10):  # past the reserved room: the buffer grows, the contents stay
        append(3, 1)
    assert growing.get_seq_length() == 21 and growing._key_buffer.shape[-2] >= 21
    plain = GrowingLayer(capacity=8)  # no repeat (n = 1): the first append reserves the room
    keys, values = _states(2, 3, 99)
    plain.update(keys, values)
    plain.update(*_states(2, 1, 100))
    assert plain._key_buffer.shape[-2] == 8 and torch.equal(plain.keys[..., :3, :], keys)


@pytest.mark.parametrize("name", ["llama-char", "gpt2-bpe"])
@pytest.mark.parametrize("n", [4, 1])
def test_sampling_with_the_in_place_cache_draws_what_the_default_cache_does(paths, name, n, monkeypatch):
    """Same seed, same prompts: the in-place cache and transformers' own give the same tokens,
    texts and log-probs, on the shared-prefill path (n = 4) and the plain one (n = 1)."""
    import workers.rollout.generation as generation

    prompts = [p.prompt for p in generate_problems(["add", "sub"], 5, seed=4, split="train")]
    generator = HFGeneration(paths[name])
    params = SamplingParams(n=n, max_new_tokens=40)
    assert generation.append_cache(generator.model, 60) is not None  # these models take the in-place cache
    out = {}
    for in_place in (True, False):
        if not in_place:
            monkeypatch.setattr(generation, "append_cache", lambda model, capacity: None)
        torch.manual_seed(5)
        out[in_place] = generator.generate(prompts, params)
    assert any(len(ids) >= 12 for c in out[True] for ids in c.token_ids)  # many appends in place
    for a, b in zip(out[True], out[False], strict=True):
        assert a.token_ids == b.token_ids and a.responses == b.responses and a.finished == b.finished
        for la, lb in zip(a.logprobs, b.logprobs, strict=True):
            np.testing.assert_allclose(la, lb, atol=1e-6)


def test_a_gpt2_row_past_its_learned_positions_fails_naming_the_setting(paths):
    """gpt2 has learned absolute positions (``n_positions``, ``builder.max_positions`` of a built
    model): a prompt plus ``max_new_tokens`` past them is refused before generating, naming the
    setting, instead of an index error inside the model."""
    prompts = [p.prompt for p in generate_problems(["add"], 2, seed=4, split="train")]
    generator = HFGeneration(paths["gpt2-bpe"])
    limit = generator.model.config.n_positions
    with pytest.raises(ValueError, match=rf"generation.max_new_tokens \({limit}\) needs \d+ positions; "
                                         rf"the model has {limit}"):
        generator.generate(prompts, SamplingParams(n=1, max_new_tokens=limit))


def test_the_replicas_rng_state_replays_its_samples_and_reads_an_older_checkpoints(paths):
    """``get_rng_state`` / ``set_rng_state`` (what checkpoints and a re-run prefetch keep): put
    back, the replica draws the same samples again; a bare CPU tensor, what checkpoints held
    before the GPU's state was kept, is read as the CPU state. On CUDA: tests/test_gpu.py."""
    prompts = [p.prompt for p in generate_problems(["add"], 2, seed=4, split="train")]
    generator = HFGeneration(paths["llama-char"])
    params = SamplingParams(n=3, max_new_tokens=12)
    state = generator.get_rng_state()
    assert state["cuda"] is None
    first = generator.generate(prompts, params)
    for saved in (state, state["cpu"]):
        generator.set_rng_state(saved)
        assert [c.token_ids for c in generator.generate(prompts, params)] == [c.token_ids for c in first]
