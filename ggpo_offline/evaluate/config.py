"""`ggpo eval`'s settings (SPEC "Evaluation") and a training run's evaluation settings, importable without
the engines or polars."""

from dataclasses import dataclass
from pathlib import Path

from ggpo_offline.core.settings import (
    FRACTION,
    Range,
    above,
    at_least,
    check_relations,
    check_settings,
    setting,
)
from ggpo_offline.generate.datasets import DatasetColumns
from ggpo_offline.generate.engines.base import Dtype, EngineName
from ggpo_offline.generate.prompts import Template

TEST_DATASETS = ("arith:test",)
"""The arith task's test split: ``ggpo eval``'s default benchmark and a training run's held-out one."""
VALIDATION_DATASETS = ("arith:validation",)
HELD_OUT_SPLITS = TEST_DATASETS
"""Dataset specs that are a test split by name: in-training evaluation may not use them."""
DEFAULT_KS = (1, 4, 8, 16, 32)
DEFAULT_ARITH_PROBLEMS = 500


@dataclass(frozen=True)
class EvalConfig:
    """Everything ``ggpo eval`` needs. Sampling fields, ``template`` and ``dtype`` left at None take the
    value of ``pool`` when one is given, else the default (temperature 1.0, top-p 1.0, no top-k, 384 tokens,
    template auto, dtype auto); ``resolve_sampling`` applies that rule."""

    model: str | None = setting(None, "Local Hugging Face model folder [default: the embedded tiny model].")
    datasets: tuple[str, ...] = setting(
        TEST_DATASETS,
        "A benchmark: arith[:train|validation|test], a .jsonl/.json/.parquet file or hf:NAME[:SPLIT]; "
        "repeat for a suite.",
        flag="dataset",
        repeat=True,
    )
    columns: DatasetColumns = setting(default_factory=DatasetColumns)
    num_problems: int | None = setting(
        None,
        f"Problems per benchmark [default: arith {DEFAULT_ARITH_PROBLEMS}, files all rows].",
        valid=at_least(1),
    )
    n: int = setting(
        32,
        "Responses per problem (the n of mean@n, pass@k).",
        flag="num-samples",
        short="n",
        valid=at_least(1),
    )
    ks: tuple[int, ...] = setting(
        DEFAULT_KS,
        "Comma-separated k of pass@k (k > n is skipped).",
        flag="ks",
        short="k",
        valid=at_least(1),
    )
    pool: Path | None = setting(None, "Take sampling settings, prompt template and dtype from this pool.")
    temperature: float | None = setting(
        None, "Sampling temperature [default: the pool's, else 1.0].", valid=above(0)
    )
    top_p: float | None = setting(
        None, "Nucleus threshold [default: the pool's, else 1.0 = off].", valid=FRACTION
    )
    top_k: int | None = setting(None, "Top-k [default: the pool's, else 0 = off].", valid=at_least(0))
    max_tokens: int | None = setting(
        None, "Response length limit [default: the pool's, else 384].", valid=at_least(1)
    )
    seed: int = setting(0, "Global sampling seed (each problem derives its own).", valid=at_least(0))
    template: Template | None = setting(
        None, "Prompt format: auto, chat or plain [default: the pool's, else auto]."
    )
    engine: EngineName = setting("vllm", "Generation engine: vllm or hf.")
    dtype: Dtype | None = setting(
        None, "Engine dtype: auto, float32, bfloat16, float16 [default: the pool's, else auto]."
    )
    reward_workers: int = setting(2, "Worker processes for math-verify (0 = in-process).", valid=at_least(0))
    reward_timeout_s: float = setting(
        5.0,
        "Time limit of one response's scoring in seconds; past it the response scores 0.",
        valid=above(0),
    )
    batch_prompts: int = setting(256, "Problems per engine call.", valid=at_least(1))
    gpu_memory_fraction: float | None = setting(
        None,
        "vLLM's share of the GPU when it shares it with a learner [default: vLLM's, 0.9].",
        valid=FRACTION,
    )
    out: Path | None = setting(None, "Write the JSON report (per-problem counts included) here.")
    overwrite: bool = setting(False, "Replace an existing --out file.")

    def __post_init__(self) -> None:
        check_settings(self)
        check_relations(
            [
                (len(self.datasets) > 0, "give at least one --dataset"),
                (len(set(self.datasets)) == len(self.datasets), "a --dataset is given twice"),
            ]
        )


@dataclass(frozen=True)
class TrainingEvalConfig:
    """How ``ggpo train`` evaluates its checkpoints: when, on which benchmarks, and under which protocol
    (``ggpo eval``'s, `protocol`). A part of `TrainConfig` whose fields are its flags and config-file keys."""

    eval_every: int | None = setting(
        None,
        "Evaluate at update 0, every N updates and at the end with ggpo eval's protocol on the saved "
        "checkpoint (the pool's sampling settings and dtype) [default: no evaluation].",
        valid=at_least(1),
    )
    eval_datasets: tuple[str, ...] = setting(
        VALIDATION_DATASETS,
        "Validation benchmark of the in-training evaluation, which selects the reported checkpoint, as ggpo "
        "eval --dataset (repeatable); a test split is refused.",
        flag="eval-dataset",
        repeat=True,
    )
    test_datasets: tuple[str, ...] = setting(
        TEST_DATASETS,
        "Held-out benchmark evaluated once, after training, on the checkpoint with the best validation "
        "mean@n and on the final one (repeatable; needs --eval-every).",
        flag="test-dataset",
        repeat=True,
    )
    test_num_problems: int | None = setting(
        None,
        "Problems per test benchmark (arith: drawn; files: the first N rows) [default: --eval-num-problems].",
        valid=at_least(1),
    )
    no_test: bool = setting(
        False,
        "Skip the end-of-run test evaluation (tuning runs choose on validation and never look at test).",
    )
    allow_test_eval: bool = setting(
        False,
        "Let --eval-dataset name a test split (arith:test). The in-training evaluation chooses the reported "
        "checkpoint, so by default it may not see test.",
    )
    eval_n: int = setting(32, "Responses sampled per evaluation problem (paper: 32).", valid=at_least(1))
    eval_ks: tuple[int, ...] = setting(
        DEFAULT_KS,
        "Comma-separated k of the logged pass@k (those above --eval-n are skipped).",
        flag="eval-k",
        valid=at_least(1),
    )
    eval_num_problems: int | None = setting(
        None,
        "Problems per evaluation benchmark (arith: drawn; files: the first N rows) [default: all].",
        valid=at_least(1),
    )
    eval_engine: EngineName = setting("vllm", "Evaluation engine: vllm or hf.")
    eval_seed: int = setting(
        0,
        "Evaluation sampling seed, the same at every update (only the weights change).",
        valid=at_least(0),
    )
    eval_gpu_memory_fraction: float = setting(
        0.3,
        "On a GPU, the share of its memory the evaluation's vLLM engine may take beside the learner.",
        valid=Range(0, 1, low_open=True, high_open=True),
    )

    def __post_init__(self) -> None:
        check_settings(self)
        check_relations(self._relations())

    def _relations(self) -> list[tuple[bool, str]]:
        """The held-out rule: the test split stays out of what chooses, since the in-training evaluation
        selects the reported checkpoint."""
        held_out = (*HELD_OUT_SPLITS, *self.test_datasets)
        on_test = [spec for spec in self.eval_datasets if spec in held_out]
        return [
            (
                self.allow_test_eval or not on_test,
                f"--eval-dataset {on_test[0] if on_test else ''}: the in-training evaluation selects the "
                "reported checkpoint, so it must not see the test split; use arith:validation (test is "
                "evaluated once at the end, --test-dataset) or pass --allow-test-eval",
            ),
            (len(set(self.test_datasets)) == len(self.test_datasets), "a --test-dataset is given twice"),
        ]

    def protocol(self, model: Path, pool: Path, test: bool = False) -> EvalConfig:
        """``ggpo eval``'s settings for a run starting from ``model`` on ``pool``: the validation (or, with
        ``test``, test) benchmarks and seed, the pool's sampling and dtype."""
        return EvalConfig(
            model=str(model),
            datasets=tuple(self.test_datasets if test else self.eval_datasets),
            n=self.eval_n,
            ks=tuple(self.eval_ks),
            num_problems=(
                self.test_num_problems
                if test and self.test_num_problems is not None
                else self.eval_num_problems
            ),
            pool=Path(pool),
            seed=self.eval_seed,
            engine=self.eval_engine,
            gpu_memory_fraction=self.eval_gpu_memory_fraction,
        )
