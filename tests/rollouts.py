"""Real rollout groups for trainer tests: a model's own samples with rewards the test picks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from graftpool.tasks import Problem
from tests.tiny_pair import Group, build_groups
from workers.rollout.generation import HFGeneration, SamplingParams


def sampled_groups(model: str, path: Path, problems: Sequence[Problem], rewards: np.ndarray) -> list[Group]:
    """``rewards.shape[1]`` real samples per problem (seeded) as groups with the given rewards.

    The rewards are fixed by the test rather than verified, so every group is mixed the
    way the test needs whatever the tiny model happens to answer.
    """
    n = rewards.shape[1]
    torch.manual_seed(0)
    completions = HFGeneration(path).generate([p.prompt for p in problems], SamplingParams(n=n, max_new_tokens=32))
    return build_groups(model, list(problems), completions, rewards, [[""] * n] * len(problems))
