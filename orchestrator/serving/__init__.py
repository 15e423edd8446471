"""A run's final models behind an OpenAI-compatible endpoint (Ray Serve), and evaluation
against such an endpoint."""
