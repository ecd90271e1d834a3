"""The evaluation protocol's defaults (SPEC "Evaluation"), importable without the engines or polars."""

DEFAULT_DATASETS = ("arith:test",)
DEFAULT_KS = (1, 4, 8, 16, 32)
