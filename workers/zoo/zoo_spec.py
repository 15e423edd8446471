"""What determines a zoo model (:class:`ModelSpec`): a pydantic model with no torch import, so
that validating a config (``orchestrator.config``) does not load torch or transformers. The
builder that turns a spec into weights is ``workers.zoo.model_zoo``."""

from __future__ import annotations

import random
from collections.abc import Collection
from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from graftpool.tasks import (
    SOLUTION_STYLES,
    TASKS,
    Problem,
    check_task_mix,
    generate_problems,
    slipped_solution,
)

Arch = Literal["llama", "gpt2", "qwen2"]
TokenizerKind = Literal["char", "bpe"]


def _check_shares(shares: dict[str, float], known: Collection[str], what: str) -> None:
    """Keys from ``known`` and values in [0, 1], or a ValueError naming what is wrong."""
    unknown = sorted(set(shares) - set(known))
    if unknown:
        raise ValueError(f"expected {what} names from {sorted(known)}, got {unknown}")
    bad = {k: q for k, q in shares.items() if not 0.0 <= q <= 1.0}
    if bad:
        raise ValueError(f"expected shares in [0, 1], got {bad}")


class ModelSpec(BaseModel):
    """Everything that determines a zoo model; its hash is the cache key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")  # names the cache folder
    arch: Arch
    tokenizer: TokenizerKind
    vocab_size: int = Field(256, ge=64)  # BPE target size; char vocabularies are ~104
    hidden_size: int = Field(64, ge=16)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(4, ge=1)
    max_positions: int = Field(128, ge=32)
    seed: int = 0
    sft_tasks: dict[str, float] = Field(default_factory=dict)
    """Task -> weight of the warm-start mix; over-weighting some tasks shapes skill."""
    sft_datasets: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """reasoning-gym datasets (name -> generator settings, as in ``data.*.datasets``) to warm-start
    on instead of the synthetic tasks; ``sft_tasks`` then weights them (empty: a uniform mix). The
    solutions are the boxed answers, worked out where the entry allows (graftpool.rg_tasks.WORKED);
    no styles or slips."""
    sft_problems: int = Field(3000, ge=1)
    sft_steps: int = Field(600, ge=0)
    sft_lr: float = Field(6e-3, gt=0)
    sft_batch_size: int = Field(64, ge=1)
    solution_style: str = "worked"
    """The warm start's solution template (graftpool.tasks.SOLUTION_STYLES)."""
    style_mix: dict[str, float] = Field(default_factory=dict)
    """Style -> share of the warm-start solutions written in that style instead of
    ``solution_style`` (seeded): a model mostly writes its own style but has seen a peer's, so
    the compatibility gate (Eq. 7) grades how familiar a peer's response is instead of
    rejecting every foreign-style response outright."""
    sft_slips: dict[str, float] = Field(default_factory=dict)
    """Task -> share of its warm-start solutions that slip (``slip``: a wrong last step that adds ten
    to the correct result, or a wrong result throughout; graftpool.tasks.slipped_solution): below 1
    the model learns the method and a habit of misapplying it, so it sits in the partial-skill regime
    on that task (pass@8 >> pass@1); at 1 it has never seen the task solved."""
    slip: Literal["last_step", "result"] = "last_step"
    """How a slipped solution is wrong (graftpool.tasks.SLIP_KINDS): ``last_step``, the correct result
    and then a step that adds ten (the correct value is in the text, so a sampled response that boxes
    it instead is right); ``result``, the style's solution with the answer plus eleven in place of
    the result throughout (the correct value is never written: the model cannot reach it by copying)."""

    @field_validator("style_mix")
    @classmethod
    def _style_shares(cls, mix: dict[str, float]) -> dict[str, float]:
        _check_shares(mix, SOLUTION_STYLES, "style")
        if sum(mix.values()) > 1:
            raise ValueError(f"expected shares summing to at most 1, got {mix}")
        return mix

    @model_validator(mode="after")
    def _head_dim(self) -> ModelSpec:
        """What the builder needs (``workers.zoo.model_zoo``): heads that split the width evenly,
        each at least 16 wide."""
        if self.hidden_size % self.num_heads or self.hidden_size // self.num_heads < 16:
            raise ValueError(f"hidden_size ({self.hidden_size}) / num_heads ({self.num_heads}) must be a whole "
                             f"head width of at least 16")
        return self

    @model_validator(mode="after")
    def _task_weights(self) -> ModelSpec:
        """``sft_tasks`` over the synthetic tasks (without ``sft_datasets``): known names, weights
        >= 0 with a positive sum; empty: every task alike."""
        if self.sft_datasets or not self.sft_tasks:
            return self
        try:
            check_task_mix(self.sft_tasks)
        except ValueError as exc:
            raise ValueError(f"sft_tasks: {exc}") from None
        return self

    @field_validator("sft_slips")
    @classmethod
    def _slip_rates(cls, slips: dict[str, float]) -> dict[str, float]:
        _check_shares(slips, TASKS, "task")
        return slips

    @field_validator("solution_style")
    @classmethod
    def _known_style(cls, style: str) -> str:
        if style not in SOLUTION_STYLES:
            raise ValueError(f"expected one of {sorted(SOLUTION_STYLES)}, got {style!r}")
        return style

    @model_validator(mode="after")
    def _reasoning_gym(self) -> ModelSpec:
        if not self.sft_datasets:
            return self
        if self.sft_slips or self.style_mix or self.slip != "last_step":
            raise ValueError("sft_slips, slip and style_mix are for the synthetic tasks, not sft_datasets")
        from graftpool.rg_tasks import check_datasets

        try:
            check_datasets(self.sft_datasets, self.sft_tasks or None)
        except ImportError as exc:
            raise ValueError(str(exc)) from None
        except ValueError as exc:
            raise ValueError(f"sft_datasets: {exc}") from None
        return self

    def sft_data(self) -> list[Problem]:
        """The warm-start set: train-side prompts only, so eval sets stay held out. Seeded: a
        ``style_mix[style]`` share of the solutions is written in that style, and a
        ``sft_slips[task]`` share of each task's with the slipped result. With ``sft_datasets``,
        drawn from those reasoning-gym generators (graftpool.rg_tasks), with replacement."""
        if self.sft_datasets:
            from graftpool.rg_tasks import generate_rg_problems

            return generate_rg_problems(self.sft_datasets, self.sft_problems, f"sft/{self.seed}", split="train",
                                        weights=self.sft_tasks or None, unique=False)
        problems = generate_problems(
            self.sft_tasks or list(TASKS), self.sft_problems, seed=self.seed, split="train", unique=False,
            style=self.solution_style,
        )
        if not (self.sft_slips or self.style_mix):
            return problems
        slips, styles = random.Random(f"slips-{self.seed}"), random.Random(f"styles-{self.seed}")
        out = []
        for p in problems:
            slipped = slips.random() < self.sft_slips.get(p.task, 0.0)
            style, draw = self.solution_style, styles.random()
            for name, share in self.style_mix.items():
                if draw < share:
                    style = name
                    break
                draw -= share
            if slipped or style != self.solution_style:
                solution = (slipped_solution(self.slip, style, p.question, p.answer) if slipped
                            else SOLUTION_STYLES[style](p.question, p.answer))
                p = replace(p, solution=solution)
            out.append(p)
        return out
