"""LoRA's adapters are drawn from the model's ``init_seed`` without touching the RNG an ``hf`` replica
samples from (``workers.lora.add_adapters``).

On a GPU a replica samples from its device's generator, which ``torch.manual_seed(seed)`` (the
replica's seed, ``run.seed`` + 1000 x its index) seeds. The adapters' init used to call
``torch.manual_seed(init_seed)`` inside ``fork_rng(devices=[])``, which puts back the CPU generator
only: the CUDA generator kept ``init_seed``'s stream, the same for every replica of the model. On a
machine without CUDA, torch queues what ``manual_seed`` asks of the CUDA generators and applies it
when CUDA starts (``torch.cuda._lazy_seed_tracker``): that queued seed is what a GPU would get, and
what these tests read there; with CUDA they read the generator's state itself.
"""

from __future__ import annotations

import torch

from workers.rollout.generation import HFGeneration

LORA = {"r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": None, "init_seed": 123}


def cuda_generator_seed() -> int | torch.Tensor:
    """The CUDA generator's state where CUDA runs; else the seed torch has queued for it (the last
    ``torch.cuda.manual_seed_all``'s, which ``torch.manual_seed`` calls)."""
    if torch.cuda.is_available():
        return torch.cuda.get_rng_state()
    queued = torch.cuda._lazy_seed_tracker.get_calls()[-1]
    assert queued is not None, "no seed queued for the CUDA generators"
    callback = queued[0]
    cells = dict(zip(callback.__code__.co_freevars, (c.cell_contents for c in callback.__closure__), strict=True))
    return cells["seed"]


def test_an_hf_replica_with_lora_samples_on_a_gpu_from_its_own_seed(paths):
    """Two replicas of one LoRA model (seeds 1000 apart, as ``spawn_model_actors`` gives them): each
    leaves the CUDA generator as its own seed set it, not as the adapters' ``init_seed``; the
    adapters are the same in both (the init is the model's)."""
    path = paths["llama-char"]
    adapters = []
    for seed in (7, 1007):
        torch.manual_seed(seed)
        expected = cuda_generator_seed()
        replica = HFGeneration(path, lora=LORA, seed=seed)
        got = cuda_generator_seed()
        assert torch.equal(got, expected) if isinstance(got, torch.Tensor) else got == expected, \
            f"replica seed {seed}: the CUDA generator holds {got}, not its seed's {expected}"
        adapters.append(replica.adapters.state())
    assert adapters[0].keys() == adapters[1].keys()
    assert all(torch.equal(adapters[0][k], adapters[1][k]) for k in adapters[0])
