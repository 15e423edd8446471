"""Ray: the actors of one model (generation replicas, trainer ranks) as one group, placement
groups and Ray start-up, and a local Ray instance for tests and demos."""
