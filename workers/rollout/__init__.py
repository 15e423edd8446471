"""The generation side: generation backends (transformers, vLLM), chat templates and prompt
prefixes, and weight sync from the trainers into the replicas."""
