"""Exchange policies: pure functions over rollout statistics, no Ray, no torch models.

An exchange is a routing (``policies.routing``: none, pair, pool, stored, every_prompt) and a
transfer (``policies.transfer``: graft, luffy, sgt, hacpo); the policy names none, graft, pool,
stored, sgt and hacpo are presets of the two (``policies.presets``). Importing the package
registers every built-in one.
"""

from policies import graft, hacpo, luffy, none, pool, presets, sgt, stored  # noqa: F401  (registration)
from policies.interface import ExchangePolicy, available_policies, make_policy, register_policy
from policies.presets import make_exchange
from policies.routing import available_routings
from policies.transfer import available_transfers

__all__ = ["ExchangePolicy", "available_policies", "available_routings", "available_transfers", "make_exchange",
           "make_policy", "register_policy"]
