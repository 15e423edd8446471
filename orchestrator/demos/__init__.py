"""The embedded demos (`make demo`, `make real-demo`)."""
