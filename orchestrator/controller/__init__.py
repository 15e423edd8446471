"""The controller: the step loop over N models, its run state, checkpoints, fault recovery,
evaluation, the exchange phase of a step, and what a step writes (trajectory store, run storage,
metrics)."""
