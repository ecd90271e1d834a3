"""Evaluation: mean@n and pass@k of a model on benchmarks (used by train and compare)."""
