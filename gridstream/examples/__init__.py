"""The seeds' workloads, with deterministic generators and in-process references."""
