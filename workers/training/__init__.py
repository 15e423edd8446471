"""The trainer side: the trainer actors (torch, DeepSpeed), precision, row batching, token
log-probs, the sampling policy's log-probs, per-update diagnostics and the result records."""
