"""The step's record between generation and the update (``graftpool.step_record``): the columns
the controller adds before routing, the exchange policy's input, and the train record the
routes select.

Pure Python/NumPy apart from the calls on the trainers' ``score`` / ``score_peers``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from graftpool.contracts import OWN, ExchangeInput, Route
from graftpool.eligibility import eligibility
from graftpool.step_record import OUTCOMES, StepRecord
from orchestrator.cluster.model_actors import ModelActors
from workers.receiver.gate_kinds import compatibility_scores
from workers.receiver.kinds import ROW_KINDS, TrainBatchBuilder
from workers.receiver.objective import grpo_advantages
from workers.training.sampling_logprobs import behaviour_logprobs, generation_means
from workers.training.trainer import TorchTrainer


def group_shape(record: StepRecord, models: Sequence[str], prompt_ids: Sequence[str], n: int) -> None:
    """Check that ``record`` holds, for each model in turn, ``n`` samples of each prompt in
    order: the layout every reshape to [models, prompts, n] below reads."""
    expected = [(m, p, i) for m in models for p in prompt_ids for i in range(n)]
    got = list(zip(record["model"], record["prompt_id"], record["sample"], strict=True))
    if got != expected:
        raise ValueError(f"the step record is not laid out model by model, prompt by prompt, {n} samples each")


def with_advantages(record: StepRecord, models: Sequence[str], n: int) -> StepRecord:
    """``advantage``: each group's GRPO advantages (Eq. 1), computed on the full group of ``n``;
    the record's layout, which the reshape reads, is checked first (:func:`group_shape`)."""
    per_model = len(record) // max(len(models), 1)
    group_shape(record, models, record["prompt_id"][0:per_model:n], n)
    rewards = np.asarray(record["reward"], dtype=float).reshape(len(models), -1, n)
    advantages = [grpo_advantages(torch.as_tensor(r, dtype=torch.float32)).numpy().astype(float) for r in rewards]
    return record.with_columns(advantage=np.concatenate(advantages).reshape(-1).tolist())


def with_source_side(record: StepRecord, actors: dict[str, ModelActors], old_logp: str,
                     recompute_source: bool = False) -> StepRecord:
    """``mean_logp``: each response's mean log-likelihood under pi_old (the gate's source side,
    Eq. 6), and where the trainers take it, ``old_logp`` per token (the ratio's denominator), as
    ``old_logp`` says (``workers.training.sampling_logprobs``): ``recompute``, the trainers'
    pre-update pass (``score``); ``sampling``, the behaviour log-probs; ``on_policy``, the
    generation means and no ``old_logp`` (an exactly on-policy update needs no extra pass).
    ``recompute_source`` (a policy's ``recompute_source``): ``mean_logp`` from the trainers' pass
    whatever pi_old is (and, unless pi_old is the behaviour log-probs, ``old_logp`` too). The trainers'
    ``old_logp`` stays in the object store: a ``TokenRef`` per row, which the driver hands on
    unopened to the receivers' ``train`` (``workers.training.token_refs``)."""
    if old_logp != "recompute" and not recompute_source:
        record = record.with_columns(mean_logp=generation_means(record["gen_logprobs"]).tolist())
        return record.with_columns(old_logp=behaviour_logprobs(record["gen_logprobs"])) if old_logp == "sampling" \
            else record
    pending = {name: actors[name].on_trainers(TorchTrainer.score, record.select(record.where(model=name)), True)
               for name in actors}
    mean, old = [None] * len(record), [None] * len(record)
    for name, calls in pending.items():
        scored = concat_shares(calls.get())
        for r, m, o in zip(record.where(model=name), scored["mean_logp"], scored["old_logp"], strict=True):
            mean[r], old[r] = m, o
    if old_logp == "sampling":
        old = behaviour_logprobs(record["gen_logprobs"])
    return record.with_columns(mean_logp=mean, old_logp=old)


def donor_token_rows(train: StepRecord, models: Sequence[str]) -> dict[str, list[int]]:
    """The train record's rows whose kind reads the donor's tokens (``RowKind.donor_tokens``), by
    the live donor model that sampled them (``models``); models with none left out."""
    reads = [r for r, kind in enumerate(train["kind"]) if ROW_KINDS.get(kind).donor_tokens]
    rows = {name: [r for r in reads if train["model"][r] == name] for name in models}
    return {name: found for name, found in rows.items() if found}


def with_answer_starts(train: StepRecord, actors: dict[str, ModelActors]) -> StepRecord:
    """``answer_start`` of the train record's rows whose kind reads the donor's tokens
    (``RowKind.donor_tokens``: graft rows, for the gate's ln s split and ``answer_masked``): how many
    of the donor response's own tokens come before its final ``\\boxed{``, counted by the donor
    model's tokenizer (its trainers' ``answer_starts``); None on every other row, and on a stored
    donor's (no trainer of its model runs here). Only the offered donor responses are counted."""
    rows = donor_token_rows(train, list(actors))
    pending = {name: actors[name].on_trainers(TorchTrainer.answer_starts, train.select(rows[name])) for name in rows}
    starts = [None] * len(train)
    for name, calls in pending.items():
        for r, start in zip(rows[name], calls.get(), strict=True):
            starts[r] = start
    return train.with_columns(answer_start=starts)


def concat_shares(answers: list[dict[str, list]]) -> dict[str, list]:
    """The data-parallel ranks' answers to ``score`` / ``score_peers`` (each its share of the
    rows, ``workers.training.rank_share``), column by column in rank order: one answer per row."""
    return {key: [value for answer in answers for value in answer[key]] for key in answers[0]}


def exchange_input(record: StepRecord, models: Sequence[str], prompt_ids: Sequence[str], n: int,
                   stored: dict[str, np.ndarray] | None = None) -> ExchangeInput:
    """[M, P, n] rewards of the live models, then one row per stored donor (NaN: no group)."""
    rows = list(np.asarray(record["reward"], dtype=float).reshape(len(models), len(prompt_ids), n))
    names = list(models)
    for name, rewards in (stored or {}).items():
        rows.append(rewards)
        names.append(name)
    live = np.array([True] * len(models) + [False] * len(stored or {}))
    return ExchangeInput(models=names, prompt_ids=list(prompt_ids), rewards=np.stack(rows), live=live)


def train_record(record: StepRecord, routes: list[Route], inp: ExchangeInput) -> StepRecord:
    """The train record: each live receiver's own rows, then what each route gives it in route
    order (the route kind's ``plan``, ``workers.receiver.kinds``), receiver by receiver."""
    receivers = [name for name, live in zip(inp.models, inp.live, strict=True) if live]
    groups = record.group_rows("model", "prompt_id")
    batch = TrainBatchBuilder(record, receivers)
    for name in receivers:
        for prompt_id in inp.prompt_ids:
            batch.add_rows(name, OWN, groups[name, prompt_id])
    for r in routes:
        donor_rows = groups[inp.models[r.donor], inp.prompt_ids[r.prompt]]
        ROW_KINDS.get(r.kind).plan(batch, r, donor_rows, inp.models[r.receiver])
    return batch.build()


def flow_matrix(routes: list[Route], num_models: int) -> np.ndarray:
    """F[donor, receiver] = number of groups moved this step (``own`` routes move nothing)."""
    flow = np.zeros((num_models, num_models), dtype=int)
    for r in routes:
        if r.kind != OWN:
            flow[r.donor, r.receiver] += 1
    return flow


def compatibility_requests(inp: ExchangeInput, usable: np.ndarray | None = None) -> dict[int, list[tuple[int, int]]]:
    """Receiver -> the (donor, prompt) groups it must score for ``donor="most_compatible"``:
    every eligible pair of live models (docs/algorithm.md section 4: a scoring pass per donor);
    ``usable``: the groups the transfer can learn from (``ExchangePolicy.donor_groups``; None: Eq. 4's)."""
    live = np.flatnonzero(inp.live).tolist()
    eligible = eligibility(inp.k, inp.n, receivers=live, donors=live, usable=usable)
    return {m: [(int(d), int(q)) for d, q in zip(*np.nonzero(eligible[:, m, :]), strict=True)]
            for m in live}


def compatibility_matrix(record: StepRecord, inp: ExchangeInput, actors: dict[str, ModelActors],
                         usable: np.ndarray | None = None) -> tuple[np.ndarray, dict[tuple, np.ndarray]]:
    """[M donor, M receiver, P] mean s (Eq. 7) of every eligible donor group under each
    receiver's old weights (NaN where not eligible), for the ``most_compatible`` donor strategy;
    and the per-token log-probs each receiver gave each response it scored (a ``TokenRef`` each,
    left in the receiver's object store), keyed (receiver, sampling model, prompt id, sample): a
    routed response is not scored twice (:func:`with_receiver_logp`)."""
    compat = np.full((len(inp.models), len(inp.models), len(inp.prompt_ids)), np.nan)
    groups = record.group_rows("model", "prompt_id")
    pending = {}
    for m, pairs in compatibility_requests(inp, usable).items():
        if pairs:
            rows = [groups[inp.models[d], inp.prompt_ids[q]] for d, q in pairs]
            # each rank scores its share of the rows (workers.training.rank_share)
            pending[m] = (pairs, rows, actors[inp.models[m]].on_trainers(TorchTrainer.score_peers, record.select(
                [r for group in rows for r in group]), True))
    mean_logp, scored = record["mean_logp"], {}
    for m, (pairs, rows, calls) in pending.items():
        answer = concat_shares(calls.get())
        means, logps = iter(answer["mean"]), iter(answer["logp"])
        for (d, q), group in zip(pairs, rows, strict=True):
            receiver_means = [next(means) for _ in group]
            for r in group:
                scored[inp.models[m], record["model"][r], record["prompt_id"][r], record["sample"][r]] = next(logps)
            compat[d, m, q] = mean_compatibility(receiver_means, [mean_logp[r] for r in group])
    return compat, scored


def mean_compatibility(receiver_mean_logp: Sequence[float], donor_mean_logp: Sequence[float]) -> float:
    """Mean gate score s (Eq. 7) of a donor group under a receiver's old weights (0 when no
    response has a finite s)."""
    s = compatibility_scores(receiver_mean_logp, donor_mean_logp)
    s = s[np.isfinite(s)]
    return float(s.mean()) if s.size else 0.0


def with_receiver_logp(train: StepRecord, scored: dict[tuple, np.ndarray]) -> StepRecord:
    """``receiver_logp``: where the receiver already scored a routed response (the compatibility
    pass), its per-token log-probs (a ``TokenRef``), so the trainer takes them as pi_old instead
    of scoring again."""
    keys = zip(train["receiver"], train["model"], train["prompt_id"], train["sample"], strict=True)
    return train.with_columns(receiver_logp=[scored.get(key) for key in keys])


def with_outcomes(train: StepRecord, receivers: Sequence[str], results: dict) -> StepRecord:
    """The train record with each trainer's outcome columns (``graftpool.step_record.OUTCOMES``,
    and those of the row kinds that bring their own) at the receiver's rows (``results``:
    receiver -> its ``TrainResult``)."""
    names = dict.fromkeys(name for receiver in receivers for name in results[receiver].outcomes)
    columns = {name: [None] * len(train) for name in (*OUTCOMES, *names)}
    for receiver in receivers:
        for name in results[receiver].outcomes:
            for r, value in zip(train.where(receiver=receiver), results[receiver].outcomes[name], strict=True):
                columns[name][r] = value
    return train.with_columns(**columns)
