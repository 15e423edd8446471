"""The rows of the learning benchmark (``make bench-learning``): each a method of the paper's
Table 1, an ablation or an exchange option, as overrides of a regime config.

A row names its regime by role (``pair`` or ``pool``); the benchmark maps the roles to config
files (``--pair-config``, ``--pool-config``; default the premise regime of issue #41,
``configs/learning_premise.yaml`` and ``configs/learning_premise_pool3.yaml``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

PAIR_MODELS = ("llama-char", "gpt2-bpe")


@dataclass(frozen=True)
class Method:
    name: str
    regime: str  # "pair" or "pool": which config the row overrides
    overrides: tuple[str, ...] = ()
    stored_from: str | None = None  # a method whose run's store donates (GRAFT stored)
    models: tuple[str, ...] = field(default=PAIR_MODELS)
    members: tuple[str, ...] = ()  # the regime config's models this row keeps (a pair of a pool); (): all

    @property
    def slug(self) -> str:
        """The run folder's name stem: letters, digits and '-' only."""
        out = self.name.lower()
        for old, new in ((" ", "-"), ("=", ""), ("+", "-"), ("(", ""), (")", ""), ("[", ""), ("]", ""), (".", ""), (":", "")):
            out = out.replace(old, new)
        return out

    def with_split(self, split: str) -> Method:
        """The same row with ``algorithm.minibatch_split`` set: named ``<name> [<split>]``."""
        return replace(self, name=f"{self.name} [{split}]",
                       overrides=(*self.overrides, f"algorithm.minibatch_split={split}"))


POOL_TRANSFERS = ("graft", "sgt", "luffy")
"""The transfers that fit the pool routing (policies/transfer.py's ``routings``); hacpo fits only
its every-prompt routing."""
OTHER_DONORS = ("most_compatible", "least_used", "random")
"""The pool routing's donor strategies besides its default, most_successes."""

SPREAD_STEP = ("exchange.peer_placement=spread", "algorithm.loss_normalizer=step")

METHODS = [
    Method("GRPO n=8", "pair", ("exchange.name=none",)),
    Method("GRPO n=16", "pair", ("exchange.name=none", "algorithm.n=16")),
    Method("GRPO n=32", "pair", ("exchange.name=none", "algorithm.n=32")),
    Method("SGT", "pair", ("exchange.name=sgt",)),
    Method("GRAFT", "pair", ("exchange.name=graft",)),
    Method("GRAFT stored", "pair", (), stored_from="GRPO n=8"),
    Method("GRAFT no gate", "pair", ("exchange.name=graft", "exchange.gate=false")),
    Method("GRAFT peer-first", "pair", ("exchange.name=graft", "exchange.peer_placement=first")),
    Method("GRAFT success-only", "pair", ("exchange.name=graft", "exchange.peer_responses=success")),
    Method("GRAFT pooled adv", "pair", ("exchange.name=graft", "exchange.peer_advantages=pooled")),
    Method("GRAFT recentered", "pair", ("exchange.name=graft", "exchange.peer_advantages=recentered")),
    Method("GRAFT group gate", "pair", ("exchange.name=graft", "exchange.gate_scope=group")),
    Method("HACPO", "pair", ("exchange.name=hacpo",)),
    # issue #28: the experiments that decide between its hypotheses, and the exchanges built for
    # off-policy peer data (docs/algorithm.md, "Exchange options for off-policy peer data")
    Method("GRAFT gate closed", "pair", ("exchange.name=graft", "exchange.delta=1e9")),
    Method("GRAFT spread", "pair", ("exchange.name=graft", "exchange.peer_placement=spread")),
    Method("GRAFT step-norm", "pair", ("exchange.name=graft", "algorithm.loss_normalizer=step")),
    Method("GRAFT spread+step", "pair", ("exchange.name=graft", *SPREAD_STEP)),
    Method("GRAFT asymmetric", "pair", ("exchange.name=graft", *SPREAD_STEP, "exchange.peer_advantages=asymmetric",
                                        "exchange.peer_beta=0.5")),
    Method("GRAFT LUFFY", "pair", ("exchange.name=graft", *SPREAD_STEP, "exchange.peer_ratio=shaped")),
    Method("GRAFT success+spread+step", "pair", ("exchange.name=graft", "exchange.peer_responses=success",
                                                 *SPREAD_STEP)),
    # issue #53: the gate x offered-responses 2x2 (gate on/off x all/correct-only) and the gate's threshold
    Method("GRAFT success-only no gate", "pair", ("exchange.name=graft", "exchange.peer_responses=success",
                                                  "exchange.gate=false")),
    Method("GRAFT delta=0.5", "pair", ("exchange.name=graft", "exchange.delta=0.5")),
    Method("GRAFT delta=0.2", "pair", ("exchange.name=graft", "exchange.delta=0.2")),
    # issue #53: what the gate scores (exchange.gate_kind), each at delta 0.8 with all responses offered
    *(Method(f"GRAFT gate={kind}", "pair", ("exchange.name=graft", f"exchange.gate_kind={kind}"))
      for kind in ("per_byte", "answer_masked", "self_calibrated")),
    Method("pool (3 models)", "pool", ("exchange.name=pool",), models=(*PAIR_MODELS, "qwen2-char")),
    # issue #52: the pool routing (policies/pool.py) with each transfer that fits it, at the pool's
    # default donor strategy (most_successes, balance pairwise); then a transfer with each other
    # donor strategy. On ``--config configs/learning_premise_pool.yaml`` they train its 4 models.
    *(Method(f"pool: {transfer}", "pool", ("exchange.name=null", "exchange.routing=pool",
                                          f"exchange.transfer={transfer}"))
      for transfer in POOL_TRANSFERS),
    *(Method(f"pool: {transfer} donor={donor}", "pool", (
        "exchange.name=null", f"exchange.routing={{name: pool, donor: {donor}}}", f"exchange.transfer={transfer}"))
      for transfer in POOL_TRANSFERS for donor in OTHER_DONORS),
]

PREMISE_ROWS = ("GRPO n=8", "GRPO n=32")
"""The premise check's rows: they run first, on every seed, before any exchange row."""

GATE_CONTROLS = ("GRAFT no gate", "GRAFT success-only no gate", "GRAFT delta=0.5", "GRAFT delta=0.2")
"""Issue #53's rows beside the table's GRAFT (gate on, all responses) and GRAFT success-only (gate
on, correct only): the 2x2 of gate {on at delta 0.8, off} x offered {all, correct only}, and the
gate's threshold delta in {0.5, 0.2} with all responses offered."""

TABLE = ("GRPO n=8", "GRPO n=16", "GRPO n=32", "GRAFT", "GRAFT gate closed", "SGT", "GRAFT success-only",
         "GRAFT asymmetric", "GRAFT LUFFY", "HACPO", "pool (3 models)", "GRAFT [groups]")
"""Issue #41's table in the premise regime (the regime's ``algorithm.minibatch_split`` is
``rows``): the GRPO rows, paper GRAFT, its gate-closed control, SGT, success-only, asymmetric,
LUFFY, HACPO, the pool of 3, and paper GRAFT cut by groups; the best exchange cut by groups is
added once it is chosen (:func:`method`)."""


PAIR_OF_POOL = re.compile(r"pair: (?P<a>[\w.-]+) \+ (?P<b>[\w.-]+) (?P<transfer>SGT|GRAFT|LUFFY|HACPO)")
"""``pair: <a> + <b> <row>`` (issue #52's best pairs): two models of the ``--config`` regime alone,
the others dropped, trained with the pair table's row ``<row>`` (its overrides: ``SGT`` is
``exchange.name=sgt``)."""


def pair_of_pool(name: str) -> Method | None:
    """The row ``pair: <a> + <b> <row>``, or None when ``name`` is not one."""
    match = PAIR_OF_POOL.fullmatch(name)
    if match is None:
        return None
    transfer = {"LUFFY": "GRAFT LUFFY"}.get(match["transfer"], match["transfer"])
    members = (match["a"], match["b"])
    return Method(name, "pool", method(transfer).overrides, models=members, members=members)


def method(name: str) -> Method:
    """The row called ``name``; ``<row> [<split>]`` is that row with ``algorithm.minibatch_split``;
    ``pair: <a> + <b> <row>`` two models of the regime with a pair row (:data:`PAIR_OF_POOL`)."""
    for m in METHODS:
        if m.name == name:
            return m
    if (pair := pair_of_pool(name)) is not None:
        return pair
    if name.endswith("]") and " [" in name:
        base, split = name[:-1].rsplit(" [", 1)
        return method(base).with_split(split)
    raise ValueError(f"unknown row {name!r}; rows: {[m.name for m in METHODS]} (and '<row> [groups]', "
                     f"'pair: <model> + <model> SGT|GRAFT|LUFFY|HACPO')")
