"""`ggpo eval`'s settings (SPEC "Evaluation"), importable without the engines or polars."""

from dataclasses import dataclass
from pathlib import Path

from ggpo_offline.core.settings import check_choices, setting
from ggpo_offline.generate.datasets import DatasetColumns
from ggpo_offline.generate.engines.base import Dtype, EngineName
from ggpo_offline.generate.prompts import Template

DEFAULT_DATASETS = ("arith:test",)
DEFAULT_KS = (1, 4, 8, 16, 32)
DEFAULT_ARITH_PROBLEMS = 500


@dataclass(frozen=True)
class EvalConfig:
    """Everything ``ggpo eval`` needs. Sampling fields, ``template`` and ``dtype`` left at None take the
    value of ``pool`` when one is given, else the default (temperature 1.0, top-p 1.0, no top-k, 384 tokens,
    template auto, dtype auto); ``resolve_sampling`` applies that rule."""

    model: str | None = setting(None, "Local Hugging Face model folder [default: the embedded tiny model].")
    datasets: tuple[str, ...] = setting(
        DEFAULT_DATASETS,
        "A benchmark: arith[:train|validation|test], a .jsonl/.json/.parquet file or hf:NAME[:SPLIT]; "
        "repeat for a suite.",
        flag="dataset",
        repeat=True,
    )
    columns: DatasetColumns = setting(default_factory=DatasetColumns)
    num_problems: int | None = setting(
        None, f"Problems per benchmark [default: arith {DEFAULT_ARITH_PROBLEMS}, files all rows]."
    )
    n: int = setting(32, "Responses per problem (the n of mean@n, pass@k).", flag="num-samples", short="n")
    ks: tuple[int, ...] = setting(
        DEFAULT_KS, "Comma-separated k of pass@k (k > n is skipped).", flag="ks", short="k"
    )
    pool: Path | None = setting(None, "Take sampling settings, prompt template and dtype from this pool.")
    temperature: float | None = setting(None, "Sampling temperature [default: the pool's, else 1.0].")
    top_p: float | None = setting(None, "Nucleus threshold [default: the pool's, else 1.0 = off].")
    top_k: int | None = setting(None, "Top-k [default: the pool's, else 0 = off].")
    max_tokens: int | None = setting(None, "Response length limit [default: the pool's, else 384].")
    seed: int = setting(0, "Global sampling seed (each problem derives its own).")
    template: Template | None = setting(
        None, "Prompt format: auto, chat or plain [default: the pool's, else auto]."
    )
    engine: EngineName = setting("vllm", "Generation engine: vllm or hf.")
    dtype: Dtype | None = setting(
        None, "Engine dtype: auto, float32, bfloat16, float16 [default: the pool's, else auto]."
    )
    reward_workers: int = setting(2, "Worker processes for math-verify (0 = in-process).")
    reward_timeout_s: float = setting(
        5.0, "Time limit of one response's scoring in seconds; past it the response scores 0."
    )
    batch_prompts: int = setting(256, "Problems per engine call.")
    gpu_memory_fraction: float | None = setting(
        None, "vLLM's share of the GPU when it shares it with a learner [default: vLLM's, 0.9]."
    )
    out: Path | None = setting(None, "Write the JSON report (per-problem counts included) here.")
    overwrite: bool = setting(False, "Replace an existing --out file.")

    def __post_init__(self) -> None:
        check_choices(self)
