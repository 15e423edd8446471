"""Rewards: the verifier protocol and its kinds (exact, math-verify, python plugins), answer
extraction, and the pool of verifier actors."""
