"""Benchmarks and the paper's experiments (scripts; ``bench.experiments`` is the active-learning harness)."""
