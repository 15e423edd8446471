"""The GPU paths, on a CUDA machine (``pytest -m gpu``): bf16 autocast in the trainer, the
collective weight sync over NCCL (and its turn to the object store where trainer and replica
share one GPU), DeepSpeed ZeRO-2 on CUDA, LoRA on CUDA. Every test here is marked ``gpu`` and
skips with its reason where there is no CUDA GPU (or fewer GPUs than it needs, or no DeepSpeed):
the CPU suite checks the same code paths on CPU (tests/test_precision.py, test_weight_sync.py,
test_scale_backends.py, test_lora.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.rollouts import sampled_groups
from tests.tiny_pair import batch_of, prepared

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs a CUDA GPU (torch.cuda.is_available() is False)")]
LORA = {"r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"], "init_seed": 0}


@pytest.fixture(scope="module")
def groups(paths):
    from graftpool.tasks import generate_problems

    problems = generate_problems(["add", "sub"], 4, seed=3, split="train")
    return sampled_groups("llama-char", paths["llama-char"], problems, np.array([[1, 0, 1, 0]] * 4, dtype=float))


def _step(trainer, groups) -> float:
    return trainer.train(prepared(trainer.score, batch_of(groups))).metrics["train/loss"]


def test_bf16_mixed_trains_on_cuda_with_fp32_masters(paths, groups):
    """bf16 autocast around the forward on CUDA: the weights stay fp32 (the masters), the loss is
    the fp32 one within bf16 rounding, the update moves the weights."""
    from workers.training.trainer import TorchTrainer

    fp32 = TorchTrainer(paths["llama-char"], device="cuda", precision="fp32", lr=1e-3, minibatches=2, seed=0)
    mixed = TorchTrainer(paths["llama-char"], device="cuda", precision="bf16-mixed", lr=1e-3, minibatches=2, seed=0)
    before = {k: v.clone() for k, v in mixed.state_dict().items()}
    loss32, loss16 = _step(fp32, groups), _step(mixed, groups)
    assert all(p.dtype == torch.float32 for p in mixed.model.parameters())
    assert np.isfinite(loss16) and loss16 == pytest.approx(loss32, abs=2e-2)
    assert any(not torch.equal(before[k], v) for k, v in mixed.state_dict().items())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL between trainer and replica needs two GPUs")
def test_collective_sync_over_nccl_between_two_gpus(paths, groups, ray_local):
    """Trainer rank 0 on one GPU, the replica on another: the broadcast over NCCL leaves the
    replica's weights equal to the trainer's (in the replica's bf16)."""
    from orchestrator.cluster.actor_calls import get_all
    from orchestrator.cluster.model_actors import ModelActors
    from workers.rollout.generation import GenerationWorker
    from workers.rollout.settings import GenerationSettings
    from workers.training.trainer import TorchTrainer

    ray = ray_local
    path = str(paths["llama-char"])
    trainer = ray.remote(TorchTrainer).options(num_gpus=1).remote(path, device="cuda", sync_dtype="bfloat16", lr=1e-2,
                                                                  minibatches=1)
    replica = ray.remote(GenerationWorker).options(num_gpus=1).remote(
        GenerationSettings(path=path, device="cuda", dtype="bfloat16"), "llama-char")
    actors = ModelActors("llama-char", [replica], [trainer], None, trainer_cls=TorchTrainer, weight_sync="collective",
                         sync_backend="nccl")
    get_all([trainer.train.remote(batch_of(groups))])
    get_all(actors.sync_weights())
    assert actors.sync.name == "collective"
    expected = {k: v.to(torch.bfloat16) for k, v in ray.get(trainer.state_dict.remote()).items()}
    got = ray.get(replica.state_dict.remote())
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=0, msg=name)


def test_one_gpu_collective_sync_turns_to_the_object_store(paths, groups, ray_local):
    """Trainer and replica on the same GPU: NCCL would refuse them ('Duplicate GPU detected'), so
    the sync warns and goes through the object store, and the replica gets the weights."""
    from orchestrator.cluster.actor_calls import get_all
    from orchestrator.cluster.model_actors import ModelActors
    from workers.rollout.generation import GenerationWorker
    from workers.rollout.settings import GenerationSettings
    from workers.training.trainer import TorchTrainer

    ray = ray_local
    path = str(paths["llama-char"])
    trainer = ray.remote(TorchTrainer).options(num_gpus=0.5).remote(path, device="cuda", lr=1e-2, minibatches=1)
    replica = ray.remote(GenerationWorker).options(num_gpus=0.5).remote(
        GenerationSettings(path=path, device="cuda", dtype="float32"), "llama-char")
    actors = ModelActors("llama-char", [replica], [trainer], None, trainer_cls=TorchTrainer, weight_sync="collective",
                         sync_backend="nccl")
    get_all([trainer.train.remote(batch_of(groups))])
    with pytest.warns(UserWarning, match="Duplicate GPU detected"):
        get_all(actors.sync_weights())
    assert actors.sync.name == "object_store"
    expected, got = ray.get(trainer.state_dict.remote()), ray.get(replica.state_dict.remote())
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=0, msg=name)


def test_deepspeed_zero2_bf16_trains_on_cuda(paths, groups, ray_local):
    """DeepSpeed ZeRO-2 with bf16 on one GPU (one rank): a step with a finite loss that moves the
    weights, as the torch backend's bf16-mixed step does."""
    pytest.importorskip("deepspeed", reason="needs the deepspeed extra (pip install -e '.[deepspeed]')")
    from orchestrator.cluster.actor_calls import get_all
    from orchestrator.cluster.model_actors import join_process_group
    from workers.training.trainer import trainer_class

    ray = ray_local
    rank = ray.remote(trainer_class("deepspeed")).options(num_gpus=1).remote(
        str(paths["llama-char"]), None, 0, deepspeed={"zero_stage": 2, "bf16": True}, device="cuda", lr=1e-3,
        minibatches=2)
    join_process_group([rank])
    before = ray.get(rank.state_dict.remote())
    batch = prepared(lambda rows: ray.get(rank.score.remote(rows)), batch_of(groups))
    metrics = get_all([rank.train.remote(batch)])[0].metrics
    after = ray.get(rank.state_dict.remote())
    assert np.isfinite(metrics["train/loss"]) and metrics["train/updates"] == 2
    assert any(not torch.equal(before[k], v) for k, v in after.items())


def test_lora_trains_on_cuda_and_its_adapters_reach_a_cuda_replica(paths, groups):
    """LoRA on CUDA: only the adapters move; the adapter-only sync makes an hf replica on the GPU
    generate what the trainer's adapted model does (greedy)."""
    from workers.rollout.generation import HFGeneration, SamplingParams, sample_completions
    from workers.training.trainer import TorchTrainer

    path = paths["llama-char"]
    trainer = TorchTrainer(path, device="cuda", lora=LORA, lr=5e-2, minibatches=1, seed=0)
    base = {k: v.clone() for k, v in trainer.state_dict().items() if ".lora_" not in k}
    _step(trainer, groups)
    assert all(torch.equal(v, trainer.state_dict()[k]) for k, v in base.items()), "the base never moves"
    replica = HFGeneration(path, device="cuda", dtype="float32", lora=LORA)  # the trainer's numerics
    replica.load_weights(trainer.weights_for_sync(), trainer.version)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=16)
    prompts = [g.prompt for g in groups]
    expected = sample_completions(trainer.model.eval(), trainer.tokenizer, prompts, greedy)
    assert [c.token_ids for c in replica.generate(prompts, greedy)] == [c.token_ids for c in expected]


def test_a_replica_on_cuda_replays_its_samples_from_its_rng_state(paths):
    """Sampling on a GPU draws from the device's generator: the replica's RNG state (checkpoints,
    a prefetch sampled again under run.async one_step) holds it, so putting it back replays the
    same tokens."""
    from graftpool.tasks import generate_problems
    from workers.rollout.generation import HFGeneration, SamplingParams

    prompts = [p.prompt for p in generate_problems(["add"], 2, seed=4, split="train")]
    generator = HFGeneration(paths["llama-char"], device="cuda")
    params = SamplingParams(n=4, max_new_tokens=12)
    state = generator.get_rng_state()
    assert state["cuda"] is not None
    first = generator.generate(prompts, params)
    torch.manual_seed(123)  # moves both generators
    generator.set_rng_state(state)
    assert [c.token_ids for c in generator.generate(prompts, params)] == [c.token_ids for c in first]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="two NCCL ranks need two GPUs (NCCL refuses two ranks "
                                                           "on one device: 'Duplicate GPU detected')")
def test_two_ranks_update_over_nccl_as_one_rank_does(paths, rollouts, ray_local):
    """Issue #51: two trainer ranks on two GPUs over NCCL take a step of own, grafted and SGT rows
    with mixed minibatches (every collective of the update on CUDA tensors), and the update equals
    one rank's. tests/test_collectives.py checks the same on CPU under a strict wrapper."""
    from orchestrator.cluster.model_actors import join_process_group
    from tests.tiny_pair import mixed_batch
    from workers.training.trainer import TorchTrainer

    ray = ray_local
    args = dict(lr=1e-3, minibatches=2, seed=0, device="cuda")
    single = TorchTrainer(paths["gpt2-bpe"], **args)
    batch = mixed_batch(paths, rollouts, single, **args)
    expected = single.train(batch)
    ranks = [ray.remote(TorchTrainer).options(num_gpus=1).remote(str(paths["gpt2-bpe"]), rank=r, world_size=2, **args)
             for r in range(2)]
    join_process_group(ranks)
    result = ray.get([t.train.remote(batch) for t in ranks])[0]
    assert [u.kind for u in result.minibatches] == [u.kind for u in expected.minibatches]
    assert result.metrics["train/loss"] == pytest.approx(expected.metrics["train/loss"], abs=1e-4)
    for actor in ranks:
        ray.kill(actor)


def test_a_one_rank_nccl_group_takes_the_tensors_of_a_trainer_on_cuda():
    """Issue #51's eighth read: a trainer's device is ``torch.device("cuda")``, its tensors are on
    ``cuda:0``; the collectives' device check refused them (torch compares the two unequal), so
    every update of two ranks on GPUs failed. One GPU holds a one-rank NCCL group: the update's
    finite-loss flag and a gradient go through it (tests/test_collectives.py has the CPU mirror)."""
    import torch.distributed as dist

    from workers.training.collectives import all_reduce, all_reduce_to_host, collective_device

    device = collective_device("nccl", torch.device("cuda"))
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert all_reduce_to_host(torch.tensor([1.0]), device, "min").tolist() == [1.0]
        grad = torch.ones(3, device=device)
        assert all_reduce(grad, device) is grad and grad.device.type == "cuda"
    finally:
        dist.destroy_process_group()


def test_a_bf16_mixed_trainer_on_cuda_syncs_bf16_weights(paths):
    """Issue #51: a vLLM replica is sent the trainer's compute dtype, bf16 from a bf16-mixed
    trainer on a GPU (``generation.sync_dtype: auto``): half the bytes of fp32."""
    from workers.precision import resolve_sync_dtype
    from workers.training.trainer import TorchTrainer

    dtype = resolve_sync_dtype("auto", "auto", "cuda")
    assert dtype == "bfloat16"
    trainer = TorchTrainer(paths["gpt2-bpe"], device="cuda", precision="auto", sync_dtype=dtype, lr=1e-3)
    sent = trainer.weights_for_sync()
    floats = [v for v in sent.values() if v.is_floating_point()]
    assert {v.dtype for v in floats} == {torch.bfloat16}
    fp32_bytes = sum(v.numel() * 4 for v in floats)
    print(f"bf16 sync: {sum(v.numel() * v.element_size() for v in floats)} bytes, fp32 {fp32_bytes}")
    assert sum(v.numel() * v.element_size() for v in floats) * 2 == fp32_bytes


def test_gradient_checkpointing_on_cuda_keeps_the_update_and_lowers_the_peak(paths, groups):
    """Issue #51: with ``trainer.gradient_checkpointing`` on CUDA the update is the one without it
    (within float tolerance); each setting's peak CUDA memory is printed for the record."""
    from workers.training.trainer import TorchTrainer

    weights, peaks = {}, {}
    for on in (False, True):
        trainer = TorchTrainer(paths["llama-char"], device="cuda", precision="fp32", gradient_checkpointing=on,
                               lr=1e-3, minibatches=1, grad_clip=1e9, seed=0)
        torch.cuda.reset_peak_memory_stats()
        _step(trainer, groups)
        peaks[on] = torch.cuda.max_memory_allocated()
        weights[on] = trainer.state_dict()
        del trainer
        torch.cuda.empty_cache()
    print(f"peak CUDA memory of one update: {peaks[False]} bytes without checkpointing, {peaks[True]} with")
    for name, value in weights[False].items():
        torch.testing.assert_close(weights[True][name], value, rtol=1e-4, atol=1e-6, msg=name)


def test_a_trainer_on_cuda_resumes_without_a_second_copy_of_its_state_on_the_gpu(paths, groups, tmp_path):
    """Issue #51's second read: ``load`` read a checkpoint onto the device it was saved from, the
    whole saved state (weights and AdamW state) beside the live one; a 3 B fp32-master model's
    36 GB beside its 48 GB on an 80 GB card. Now the peak of a resume stays under half the state."""
    from workers.training.trainer import TorchTrainer

    trainer = TorchTrainer(paths["llama-char"], device="cuda", precision="fp32", lr=1e-3, minibatches=1, seed=0)
    _step(trainer, groups)
    trainer.save(tmp_path)
    expected = trainer.state_dict()
    state_bytes = 3 * sum(p.numel() * p.element_size() for p in trainer.params)  # weights, exp_avg, exp_avg_sq
    live = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    assert trainer.load(tmp_path) == 1
    grown = torch.cuda.max_memory_allocated() - live
    print(f"resume: CUDA peak {grown} bytes over the live {live}, saved state {state_bytes}")
    assert grown < state_bytes / 2
    for name, value in trainer.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=0, msg=name)
    assert {s["exp_avg"].device.type for s in trainer.optimizer.state.values()} == {"cuda"}


def test_a_trainer_checkpoint_on_cuda_keeps_the_devices_rng_state(paths, tmp_path):
    """Issue #51's forty-sixth read (a note, fixed at the fold-in): a checkpoint kept the host's torch
    RNG state only, so on a GPU, where dropout (a LoRA adapter's, a model's own) draws from the
    device's generator, a resumed run drew other masks than the run it continues."""
    from workers.training.trainer import TorchTrainer

    trainer = TorchTrainer(paths["llama-char"], device="cuda", precision="fp32", lr=1e-3, minibatches=1, seed=0)
    trainer.save(tmp_path)
    ahead = torch.rand(8, device="cuda")
    trainer.load(tmp_path)
    assert torch.equal(torch.rand(8, device="cuda"), ahead)


def test_an_hf_rollout_on_cuda_holds_one_steps_logits():
    """Issue #51's fourth read: ``generate(output_logits=True)`` kept every step's fp32 logits on
    the GPU to the end (256 rows x 4,096 tokens x 151,936: 637 GB); the log-probs are now taken
    step by step (``workers.rollout.step_logprobs``). 64 rows x 256 new tokens on a 400-token
    vocabulary: the rollout's CUDA peak stays under an eighth of every step's logits; printed."""
    from tests.llama3_style import llama3_tokenizer
    from tests.test_generation_memory import _tiny_llama
    from workers.rollout.generation import SamplingParams, sample_completions

    tokenizer = llama3_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token
    model = _tiny_llama(len(tokenizer)).to("cuda")
    torch.manual_seed(0)
    live = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    done = sample_completions(model, tokenizer, ["13+29=", "7-5=", "9 mod 4=", "2+2="] * 2,
                              SamplingParams(8, 1.0, 1.0, 256), chat_template="none")
    grown = torch.cuda.max_memory_allocated() - live
    steps = max(len(ids) for c in done for ids in c.token_ids)
    every_step = 64 * steps * len(tokenizer) * 4
    print(f"hf rollout on CUDA: peak {grown} bytes over the live {live}; every step's fp32 logits {every_step}")
    assert steps > 128 and grown < every_step / 8
