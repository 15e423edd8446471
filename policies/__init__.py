"""Exchange policies: pure functions over rollout statistics, no Ray, no torch models.

Importing the package registers every built-in policy (none, graft, pool, stored, sgt, hacpo).
"""

from policies import graft, hacpo, none, pool, sgt, stored  # noqa: F401  (registration)
from policies.interface import ExchangePolicy, available_policies, make_policy, register_policy

__all__ = ["ExchangePolicy", "available_policies", "make_policy", "register_policy"]
