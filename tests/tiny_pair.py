"""Helpers over the tiny-pair fixtures (``paths``, ``rollouts`` in ``tests/conftest.py``): a
model's groups read from the step record (``graftpool.step_record``), a receiver's batch built
from groups as the controller's routes would build it, and its outcomes read back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from graftpool.contracts import GRAFT, OWN, PEER, SGT, SUCCESS_THRESHOLD
from graftpool.step_record import StepRecord
from graftpool.tasks import Problem
from workers.receiver.kinds import groups_of
from workers.receiver.objective import grpo_advantages
from workers.rollout.generation import Completion, completion_record
from workers.training.train_result import TrainResult


@dataclass
class Group:
    """One model's n responses on one prompt (a test's view of n rows of the step record)."""

    model: str
    prompt_id: str
    prompt: str
    responses: list[str]
    token_ids: list[list[int]]
    gen_logprobs: list[list[float]]
    rewards: np.ndarray
    policy_version: int = 0
    advantages: np.ndarray | None = None
    mean_logp: np.ndarray | None = None
    reasons: list[str] = field(default_factory=list)
    finished: list[bool] = field(default_factory=list)
    rendered_prompt: str = ""

    @property
    def n(self) -> int:
        return len(self.responses)

    @property
    def k(self) -> int:
        return int((np.asarray(self.rewards) > SUCCESS_THRESHOLD).sum())

    @property
    def is_mixed(self) -> bool:
        return 1 <= self.k < self.n

    def rows(self) -> list[dict]:
        """The group's rows of the step record."""
        advantages = self.advantages if self.advantages is not None else np.zeros(self.n)
        return [{"model": self.model, "prompt_id": self.prompt_id, "sample": i, "prompt": self.prompt,
                 "rendered_prompt": self.rendered_prompt or self.prompt, "response": text,
                 "token_ids": list(self.token_ids[i]) if self.token_ids else [],
                 "gen_logprobs": list(self.gen_logprobs[i]) if self.gen_logprobs else [],
                 "finished": bool(self.finished[i]) if self.finished else True, "policy_version": self.policy_version,
                 "reward": float(self.rewards[i]), "reason": self.reasons[i] if self.reasons else "",
                 "advantage": float(advantages[i]),
                 "mean_logp": None if self.mean_logp is None else float(self.mean_logp[i])}
                for i, text in enumerate(self.responses)]

    def record(self) -> StepRecord:
        return StepRecord.from_rows(self.rows())


def build_groups(model: str, problems: Sequence[Problem], completions: Sequence[Completion], rewards: np.ndarray,
                 reasons: Sequence[Sequence[str]]) -> list[Group]:
    """Groups of a model's completions with the given rewards and their GRPO advantages (Eq. 1)."""
    record = completion_record(model, [p.prompt_id for p in problems], [p.prompt for p in problems],
                               list(completions))
    advantages = grpo_advantages(torch.as_tensor(np.asarray(rewards), dtype=torch.float32)).numpy().astype(float)
    out = []
    for i, p in enumerate(problems):
        rows = record.where(prompt_id=p.prompt_id)
        out.append(Group(model, p.prompt_id, p.prompt, [record["response"][r] for r in rows],
                         [record["token_ids"][r] for r in rows], [record["gen_logprobs"][r] for r in rows],
                         np.asarray(rewards[i], dtype=float), record["policy_version"][rows[0]], advantages[i],
                         None, list(reasons[i]), [record["finished"][r] for r in rows],
                         record["rendered_prompt"][rows[0]]))
    return out


def with_source_side(trainer, groups: Sequence[Group]) -> list[Group]:
    """The groups with their mean log-likelihood under ``trainer``'s current weights (its
    ``score``: the gate's source side, Eq. 6)."""
    from dataclasses import replace

    out = []
    for group in groups:
        out.append(replace(group, mean_logp=np.asarray(trainer.score(group.record())["mean_logp"], dtype=float)))
    return out


def grafts_for(receiver: str, donor: str, groups) -> list[Group]:
    """The donor's mixed groups on the receiver's all-fail prompts (Eq. 4), to graft."""
    return [d for r, d in zip(groups[receiver], groups[donor], strict=True) if r.k == 0 and d.is_mixed]


def batch_of(own=(), grafts=(), sgt=(), peers=(), receiver: str = "receiver") -> StepRecord:
    """A receiver's batch (its rows of the train record) from its parts, as the routes build it:
    own groups, donor groups to graft, (prompt, response[, finished, prompt_id]) SGT items,
    (group, advantages) peer groups to add."""
    rows: list[dict] = []
    group = 0

    def add(g: Group, kind: str, advantages=None) -> None:
        nonlocal group
        for i, row in enumerate(g.rows()):
            rows.append({**row, "receiver": receiver, "kind": kind, "group": group, "source_model": g.model,
                         "advantage": row["advantage"] if advantages is None else float(advantages[i])})
        group += 1

    for g in own:
        add(g, OWN)
    for g in grafts:
        add(g, GRAFT)
    for g, advantages in peers:
        add(g, PEER, advantages)
    for item in sgt:
        prompt, response, *rest = item
        finished, prompt_id = (rest[0] if rest else True), (rest[1] if len(rest) > 1 else "")
        rows.append({"model": "donor", "prompt_id": prompt_id, "sample": -1, "prompt": prompt,
                     "rendered_prompt": prompt, "response": response, "token_ids": [], "gen_logprobs": [],
                     "finished": finished, "policy_version": 0, "reward": float("nan"), "reason": "",
                     "advantage": 0.0, "mean_logp": None, "receiver": receiver, "kind": SGT, "group": group,
                     "source_model": "donor"})
        group += 1
    names = list(rows[0]) if rows else ["kind", "group", "prompt_id", "prompt", "response", "token_ids", "finished",
                                        "reward", "advantage", "mean_logp", "sample"]
    return StepRecord.from_rows(rows, names)


def prepared(score, batch: StepRecord) -> StepRecord:
    """``batch`` with its own rows' ``old_logp`` from ``score`` (a trainer's ``score``: the
    pre-update pass a recomputing trainer needs; the controller's ``with_source_side``)."""
    own = batch.where(kind=OWN)
    old = [None] * len(batch)
    if own:
        for r, logp in zip(own, score(batch.select(own))["old_logp"], strict=True):
            old[r] = logp
    return batch.with_columns(old_logp=old)


def per_group(batch: StepRecord, result: TrainResult, kind: str, column: str) -> list[list]:
    """An outcome column of the rows of ``kind``, group by group."""
    return [[result.outcomes[column][r] for r in rows] for rows in groups_of(batch, kind)]


def own_updates(batch: StepRecord, result: TrainResult) -> dict[str, int]:
    """The update that trained each own group, by prompt id (-1: none, e.g. replaced by a graft)."""
    return {batch["prompt_id"][rows[0]]: max(result.outcomes["update"][r] for r in rows)
            for rows in groups_of(batch, OWN)}


def made_mixed(group: Group) -> Group:
    """``group`` if it is mixed; else (all pass or all fail) with its first response's reward
    flipped (0 <-> 1) and Eq. 1's advantages recomputed: a mixed group, whose rows carry a gradient."""
    if group.is_mixed:
        return group
    rewards = np.asarray(group.rewards, dtype=float).copy()
    rewards[0] = 1.0 - rewards[0]
    advantages = grpo_advantages(torch.tensor(rewards)[None]).numpy()[0]
    return replace(group, rewards=rewards, advantages=advantages)


def mixed_batch(paths, rollouts, receiver, **donor_args) -> StepRecord:
    """gpt2-bpe's own groups, llama-char's mixed groups grafted onto them, and an SGT item, with
    pi_old from ``receiver``'s ``score``: minibatches of own and peer rows (own/peer gradient
    parts), and SGT rows."""
    from workers.training.trainer import TorchTrainer

    problems, groups = rollouts
    donor = TorchTrainer(paths["llama-char"], **donor_args)
    grafts = [g for g in with_source_side(donor, groups["llama-char"]) if g.is_mixed][:3]
    assert grafts, "the llama model should have mixed groups on these prompts"
    batch = batch_of(groups["gpt2-bpe"], grafts, sgt=[(problems[0].prompt, problems[0].solution)])
    return prepared(receiver.score, batch)
