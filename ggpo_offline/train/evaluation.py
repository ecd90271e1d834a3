"""Evaluation during training: when it happens, which protocol it uses and how its scores are named."""

from pathlib import Path

from ggpo_offline.evaluate import EvalConfig
from ggpo_offline.train.config import TrainConfig

EVAL_FOLDER = "eval"


def eval_config(config: TrainConfig, initial_model: Path) -> EvalConfig:
    """``ggpo eval``'s protocol for this run: the run's benchmarks and seed, the pool's sampling and dtype,
    starting from the run's initial model."""
    return EvalConfig(
        model=str(initial_model),
        datasets=tuple(config.eval_datasets),
        n=config.eval_n,
        ks=tuple(config.eval_ks),
        num_problems=config.eval_num_problems,
        pool=Path(config.pool),
        seed=config.eval_seed,
        engine=config.eval_engine,
        gpu_memory_fraction=config.eval_gpu_memory_fraction,
    )


def eval_due(config: TrainConfig, update: int) -> bool:
    """Update 0 (the initial model), every ``eval_every`` updates, and the final update."""
    if config.eval_every is None:
        return False
    return update % config.eval_every == 0 or update == config.updates


def eval_report_path(run_dir: Path, update: int) -> Path:
    return run_dir / EVAL_FOLDER / f"update-{update:06d}.json"


def eval_metrics(report: dict) -> dict[str, float]:
    """``eval/<benchmark>/mean_at_<n>`` and ``eval/<benchmark>/pass_at_<k>``, plus ``eval/suite/...``.

    MLflow metric names cannot contain ``@``, hence ``mean_at_32`` for mean@32.
    """
    n = report["n"]
    metrics = {}
    scopes = {**report["benchmarks"], "suite": report["suite"]}
    for scope, scores in scopes.items():
        metrics[f"eval/{scope}/mean_at_{n}"] = scores["mean@n"]
        for k in report["ks"]:
            metrics[f"eval/{scope}/pass_at_{k}"] = scores[f"pass@{k}"]
    return metrics
