"""Generation: a small protocol, the ``hf`` backend (transformers ``generate``) and the Ray
actor around a backend.

A backend samples n responses per prompt and returns, per response, the string, the
token ids (in the model's own tokenizer, EOS included when the response finished) and
per-token log-probs of the sampled tokens under the model (temperature 1, before any
top-p truncation: the behaviour model's own distribution). Weights are replaced in
place after each trainer update; each result records the policy version it came from.
The actor (:class:`GenerationWorker`) turns a backend's completions into the step's record
(``graftpool.step_record``): one row per response.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import torch
from transformers import AutoModelForCausalLM

from graftpool.step_record import GENERATED, StepRecord
from workers.dispatch import Dispatch, dispatch
from workers.hub import model_folder
from workers.lora import Adapters
from workers.model_files import ModelSource, local_model
from workers.precision import generation_dtype
from workers.registries import BACKENDS  # name -> a factory taking GenerationSettings
from workers.rollout.chat import encode_kwargs, render_prompt, stop_token_ids, with_stops
from workers.rollout.cpu_priority import lower_cpu_priority
from workers.rollout.kv_budget import KVBudget, plan_calls, position_bytes, resolve_budget
from workers.rollout.kv_cache import growing_cache
from workers.rollout.prefix import cache_argument, prefill
from workers.rollout.sampling_only import sampling_only
from workers.rollout.settings import GenerationSettings
from workers.rollout.step_logprobs import StepLogprobs, model_turn
from workers.rollout.tokenizer import load_tokenizer
from workers.rollout.weight_sync import SyncPlan, cuda_device_uuid, open_group, receive


@dataclass
class SamplingParams:
    n: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()  # ids that end a response besides the backend's (serve's turn end)


@dataclass
class Completion:
    """The n sampled responses for one prompt."""

    responses: list[str]
    token_ids: list[list[int]]
    logprobs: list[list[float]]
    finished: list[bool]
    policy_version: int
    prompt: str = ""  # the prompt as this model saw it (rendered with its chat template)

    def joined(self, more: Completion) -> Completion:
        """This prompt's responses followed by ``more`` of the same prompt (a call split in parts)."""
        return Completion(self.responses + more.responses, self.token_ids + more.token_ids,
                          self.logprobs + more.logprobs, self.finished + more.finished, self.policy_version,
                          self.prompt)


class GenerationBackend(Protocol):
    version: int

    def generate(self, prompts: list[str], params: SamplingParams) -> list[Completion]: ...

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None: ...

    def get_rng_state(self) -> object:
        """What sampling draws from; a checkpoint keeps it so a resumed run samples the same."""
        ...

    def set_rng_state(self, state: object) -> None: ...


register_backend = BACKENDS.register


def make_backend(settings: GenerationSettings) -> GenerationBackend:
    return BACKENDS.get(settings.backend)(settings)


class HFGeneration:
    """transformers ``generate``: batched with left padding, KV cache, stop at EOS. The model
    runs on ``device`` in ``dtype`` (``models[].generation.dtype``; auto: bfloat16 on a GPU,
    float32 on a CPU, ``workers.precision``); weights that arrive are cast to it as they are
    copied in. Sampled tokens' log-probs are fp32 whatever the dtype.

    ``lora`` (``models[].lora``, ``workers.lora``): the model gets the trainer's adapters, and a
    weight sync brings the adapter weights only, copied into them in place; the base model is
    never replaced.

    ``kv_cache_budget_gb`` (``workers.rollout.kv_budget``): a call whose rows' KV cache would not
    fit is sampled in sub-batches that do (``gpu_share``: the replica's share of its GPU, for auto)."""

    def __init__(self, path: str | Path | ModelSource, batch_size: int = 256, trust_remote_code: bool = False,
                 chat_template: str = "auto", dtype: str = "auto", device: str = "cpu", lora: dict | None = None,
                 seed: int | None = None, pad_token: str | None = None, kv_cache_budget_gb: float | str = "auto",
                 gpu_share: float = 1.0):
        if seed is not None:  # sampling draws from torch's global RNG (None: leave it as it is)
            torch.manual_seed(seed)
        # a folder the driver shipped: this node's copy (workers.model_files); a hub id: this node's
        # Hugging Face cache (workers.hub)
        folder = model_folder(local_model(path))
        self.tokenizer = load_tokenizer(folder, trust_remote_code, pad_token)
        self.model = AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
        self.model.to(device=torch.device(device), dtype=generation_dtype(dtype, device))
        self.adapters = None if lora is None else Adapters(self.model, lora)
        self.model.eval()
        self.batch_size = batch_size
        self.chat_template = chat_template
        self.version = 0
        self.kv_budget = KVBudget(folder.name, resolve_budget(kv_cache_budget_gb, self.model.device, gpu_share),
                                  position_bytes(self.model.config, self.model.dtype))

    @classmethod
    def from_settings(cls, s: GenerationSettings) -> HFGeneration:
        """The backend's factory (``BACKENDS``): a replica's typed settings."""
        return cls(s.path, s.batch_size, s.trust_remote_code, s.chat_template, s.dtype, s.device, s.lora, s.seed,
                   s.pad_token, s.kv_cache_budget_gb, s.gpu_share)

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        if self.adapters is not None:
            self.adapters.load(state_dict.items())
        else:
            self.model.load_state_dict(state_dict)  # copies into the model's tensors: cast to its dtype
        self.version = version

    @torch.no_grad()
    def load_weight_stream(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy (name, tensor) pairs into the weights in place, as they arrive (collective sync:
        one bucket in memory at a time). Every weight of the model (with LoRA: every adapter
        weight) must come."""
        if self.adapters is not None:
            self.adapters.load(weights)
            self.version = version
            return
        params = self.model.state_dict()
        seen = set()
        for name, tensor in weights:
            params[name].copy_(tensor)
            seen.add(name)
        missing = sorted(set(params) - seen)
        if missing:
            raise RuntimeError(f"weight sync left {len(missing)} weights stale, e.g. {missing[:3]}")
        self.version = version

    def get_rng_state(self) -> dict[str, torch.Tensor | None]:
        """The torch RNG states ``generate`` samples from: the process's CPU one, and the replica's
        GPU's where the model runs on one (sampling there draws from the device's generator)."""
        device = self.model.device
        return {"cpu": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}

    def set_rng_state(self, state: dict[str, torch.Tensor | None] | torch.Tensor) -> None:
        if isinstance(state, torch.Tensor):  # a checkpoint written before the GPU state was kept
            state = {"cpu": state, "cuda": None}
        torch.set_rng_state(state["cpu"])
        if state["cuda"] is not None:
            torch.cuda.set_rng_state(state["cuda"], self.model.device)

    @torch.no_grad()
    def generate(self, prompts: list[str], params: SamplingParams) -> list[Completion]:
        """``batch_size // n`` prompts a ``generate`` call, fewer rows where their KV cache would
        not fit ``kv_cache_budget_gb`` (``kv_budget.plan_calls``)."""
        completions: list[Completion] = []
        for start, end, samples in plan_calls(len(prompts), params.n, self.batch_size, self._rows_fit(prompts, params)):
            chunk = self._generate_chunk(prompts[start:end], replace(params, n=samples))
            if samples < params.n and start < len(completions):  # the next part of a prompt's samples
                completions[start] = completions[start].joined(chunk[0])
            else:
                completions += chunk
        return completions

    def _rows_fit(self, prompts: list[str], params: SamplingParams) -> int | None:
        """Rows of ``params`` whose KV cache fits the budget with the longest of ``prompts``
        (None: no budget)."""
        if self.kv_budget.budget is None or not prompts:
            return None
        tok = self.tokenizer
        rendered = [render_prompt(tok, p, self.chat_template) for p in prompts]
        longest = max(len(ids) for ids in tok(rendered, **encode_kwargs(tok, self.chat_template))["input_ids"])
        rows = min(max(1, self.batch_size // params.n), len(prompts)) * params.n
        return self.kv_budget.rows_fit(longest + params.max_new_tokens, rows)

    def _generate_chunk(self, prompts: list[str], params: SamplingParams) -> list[Completion]:
        return sample_completions(self.model, self.tokenizer, prompts, params, self.version, self.chat_template)


register_backend("hf")(HFGeneration.from_settings)


@torch.no_grad()
def shared_prompt_cache(model, encoded: dict[str, torch.Tensor], n: int,
                        capacity: int = 0) -> dict[str, object] | None:
    """Prefill each left-padded prompt ONCE and copy its KV cache ``n`` times (row i*n+j is
    prompt i's j-th sample, as ``num_return_sequences`` orders them); None where this does not
    apply (n = 1, a one-token prompt batch, a model whose cache cannot be repeated).

    The n samples of a prompt share its prefix, so ``generate`` with ``num_return_sequences``
    runs the same prefill n times: with ~50-token prompts and 16 new tokens that is most of a
    rollout's compute. The prefill covers all but the last prompt token (``generate`` needs
    one uncached token to start from) with the position ids ``generate`` itself gives left
    padded rows (cumsum of the mask - 1, 1 on padding). Sampling draws the same random
    numbers in the same order, so the samples and their log-probs are those of the unshared
    path up to float summation order (``tests/test_workers.py`` checks both). ``capacity`` > 0:
    the cache appends in place into room for that many positions (:func:`append_cache`)."""
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    if n < 2 or ids.shape[1] < 2:
        return None
    cache = prefill(model, ids, mask, append_cache(model, capacity))
    if not hasattr(cache, "batch_repeat_interleave"):
        return None
    cache.batch_repeat_interleave(n)
    return {cache_argument(model): cache}


def append_cache(model, capacity: int):
    """The KV cache ``generate`` samples into: one that writes each new token in place into room
    reserved for ``capacity`` positions (:mod:`workers.rollout.kv_cache`; transformers' default
    copies the whole cache at every token), or None (transformers makes its own) for
    ``capacity`` 0 or a model whose cache is not a ``DynamicCache``."""
    supports = getattr(model, "_supports_default_dynamic_cache", None)
    if capacity <= 0 or supports is None or not supports():
        return None
    return growing_cache(model.config, capacity)


@torch.no_grad()
def sample_completions(model, tokenizer, prompts: list[str], params: SamplingParams,
                       version: int = 0, chat_template: str = "auto") -> list[Completion]:
    """One ``generate`` call: n responses per prompt, left padded, stopped at the model's stop
    tokens (EOS and its generation config's end-of-turn ids, ``workers.rollout.chat``); prompts are
    rendered with the model's chat template (``chat_template``).

    Greedy when ``params.temperature`` is 0. Log-probs are those of the sampled tokens under
    the raw model logits (temperature 1, before top-p): the behaviour model's distribution.
    """
    tok = tokenizer
    rendered = [render_prompt(tok, p, chat_template) for p in prompts]
    stops = with_stops(stop_token_ids(tok, getattr(model, "generation_config", None), chat_template), params.stop_token_ids)
    encoded = tok(rendered, return_tensors="pt", padding=True, padding_side="left",
                  **encode_kwargs(tok, chat_template)).to(model.device)
    sample = params.temperature > 0
    capacity = encoded["input_ids"].shape[1] + params.max_new_tokens  # the longest row's positions
    learned = getattr(model.config, "n_positions", None)  # learned absolute positions (gpt2): none past them
    if learned is not None and capacity > learned:
        raise ValueError(f"a prompt of {capacity - params.max_new_tokens} tokens plus generation.max_new_tokens "
                         f"({params.max_new_tokens}) needs {capacity} positions; the model has {learned} "
                         f"(builder.max_positions for a built model)")
    with model_turn(model), sampling_only(model):  # one turn: no other thread's forward reaches the recorder
        shared = shared_prompt_cache(model, encoded, params.n, capacity)
        if shared is not None:  # each prompt's prefill computed once, its cache copied n times
            inputs = {key: value.repeat_interleave(params.n, dim=0) for key, value in encoded.items()} | shared
            copies = 1
        else:
            inputs, copies = dict(encoded), params.n
            cache = append_cache(model, capacity)
            if cache is not None:
                inputs[cache_argument(model)] = cache
        with StepLogprobs(model) as steps:  # one step's logits held at a time, not generate's output_logits
            out = model.generate(
                **inputs,
                do_sample=sample,
                temperature=params.temperature if sample else None,
                top_p=params.top_p if sample else None,
                top_k=0 if sample else None,
                num_return_sequences=copies,
                max_new_tokens=params.max_new_tokens,
                eos_token_id=stops,
                pad_token_id=tok.pad_token_id,
                return_dict_in_generate=True,
            )
    prompt_len = encoded["input_ids"].shape[1]
    new_tokens = out.sequences[:, prompt_len:]
    logprobs = steps.logprobs(new_tokens)
    completions = []
    for i in range(len(prompts)):
        ids, lps, texts, finished = [], [], [], []
        for r in range(i * params.n, (i + 1) * params.n):
            seq = new_tokens[r].tolist()
            ends = [t for t, token in enumerate(seq) if token in stops]
            done = bool(ends)
            length = ends[0] + 1 if done else len(seq)
            ids.append(seq[:length])
            lps.append(logprobs[r, :length].tolist())
            texts.append(tok.decode(seq[:length], skip_special_tokens=True))
            finished.append(done)
        completions.append(Completion(texts, ids, lps, finished, version, rendered[i]))
    return completions


def completion_record(model: str, prompt_ids: list[str], prompts: list[str],
                      completions: list[Completion]) -> StepRecord:
    """The step record's generated rows (``graftpool.step_record.GENERATED``) of one model's
    completions, prompt by prompt, sample by sample."""
    rows: dict[str, list] = {name: [] for name in GENERATED}
    for prompt_id, prompt, c in zip(prompt_ids, prompts, completions, strict=True):
        for i, text in enumerate(c.responses):
            for name, value in (("model", model), ("prompt_id", prompt_id), ("sample", i), ("prompt", prompt),
                                ("rendered_prompt", c.prompt), ("response", text), ("token_ids", c.token_ids[i]),
                                ("gen_logprobs", c.logprobs[i]), ("finished", c.finished[i]),
                                ("policy_version", c.policy_version)):
                rows[name].append(value)
    return StepRecord(rows)


class GenerationWorker:
    """The Ray actor around one backend replica (wrapped with ``ray.remote`` by the controller).
    Each method declares how the controller calls it on the model's replicas (``workers.dispatch``)."""

    def __init__(self, settings: GenerationSettings, model: str = ""):
        torch.set_num_threads(settings.num_threads)
        if settings.nice:
            lower_cpu_priority(settings.nice)
        # each backend seeds itself: ``hf`` the torch RNG it samples from, ``vllm`` its engine
        self.backend = make_backend(settings)
        self.model = model

    @dispatch(Dispatch.SPLIT)
    def rollout(self, prompt_ids: list[str], prompts: list[str], params: SamplingParams) -> StepRecord:
        """``params.n`` responses per prompt as rows of the step's record (:func:`completion_record`)."""
        return completion_record(self.model, prompt_ids, prompts, self.backend.generate(prompts, params))

    @dispatch(Dispatch.EACH_REPLICA)
    def generate(self, prompts: list[str], params: SamplingParams) -> list[Completion]:
        """The backend's completions, prompt by prompt (serving, checks and tests; a step takes
        :meth:`rollout`)."""
        return self.backend.generate(prompts, params)

    @dispatch(Dispatch.EACH_REPLICA)
    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> int:
        self.backend.load_weights(state_dict, version)
        return version

    # -- collective weight sync (workers.rollout.weight_sync): this replica is rank ``rank`` >= 1 ------

    @dispatch(Dispatch.SCATTER)
    def open_sync_group(self, host: str, port: int, rank: int, world_size: int, plan: SyncPlan,
                        backend: str = "gloo") -> bool:
        """Join the sync group as rank ``rank`` (each replica its own: 1..R) of ``world_size``."""
        self._sync = (open_group(host, port, rank, world_size, backend), plan, "cuda" if backend == "nccl" else "cpu")
        return True

    @dispatch(Dispatch.EACH_REPLICA)
    def receive_weights(self, version: int) -> int:
        """Take part in the trainer's broadcast and load what arrives (a backend without a
        streaming loader gets the whole state dict at the end)."""
        group, plan, device = self._sync
        stream = receive(group, plan, device)
        loader = getattr(self.backend, "load_weight_stream", None)
        if loader is not None:
            loader(stream, version)
        else:
            self.backend.load_weights(dict(stream), version)
        return version

    @dispatch(Dispatch.EACH_REPLICA)
    def version(self) -> int:
        return self.backend.version

    @dispatch(Dispatch.EACH_REPLICA)
    def device_uuid(self) -> str:
        """The UUID of the CUDA device this replica computes on ("" on a CPU)."""
        return cuda_device_uuid()

    @dispatch(Dispatch.EACH_REPLICA)
    def node_id(self) -> str:
        """The Ray node this replica runs on (the run folder's ``actors.json``)."""
        import ray

        return ray.get_runtime_context().get_node_id()

    @dispatch(Dispatch.EACH_REPLICA)
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The replica's weights on the CPU (``hf``: what a sync must have made equal to the
        trainer's; checks and tests)."""
        model = getattr(self.backend, "model", None)
        if model is None:
            raise NotImplementedError(f"{type(self.backend).__name__} does not expose its weights")
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

    @dispatch(Dispatch.EACH_REPLICA)
    def get_rng_state(self) -> object:
        """The backend's sampling state (part of a checkpoint: a resumed run samples what an
        uninterrupted one would)."""
        return self.backend.get_rng_state()

    @dispatch(Dispatch.SCATTER)
    def set_rng_state(self, state: object) -> bool:
        """The sampling state :meth:`get_rng_state` returned (each replica its own)."""
        self.backend.set_rng_state(state)
        return True
