"""Models built in code (the zoo), packaged pretrained models, warm starts."""
