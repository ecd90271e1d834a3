"""A finished run as the report reads it, and the check that a comparison's runs share pool and data plan."""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ggpo_offline.core.errors import UserError
from ggpo_offline.evaluate.eval_report import EvalReport
from ggpo_offline.train.run_folder import RunFolder
from ggpo_offline.train.run_records import RunResult, RunSettings, best_update


@dataclass(frozen=True)
class RunRecord:
    """A finished run as the report reads it: settings, fingerprints, evaluations and metric records."""

    method: str
    seed: int
    run_dir: Path
    settings: RunSettings
    """config.json as written: the TrainConfig's settings and the fingerprints."""
    result: RunResult
    evals: dict[int, EvalReport]
    """Validation evaluation report per update."""
    metrics: list[dict]
    tests: dict[int, EvalReport] = field(default_factory=dict)
    """Test evaluation report per update: the selected and the final checkpoint ({} when not tested)."""


def validation_counts(record: RunRecord) -> dict[int, dict[str, int]]:
    """A run's validation evaluations as update -> prompt id -> correct samples, every benchmark merged."""
    return {
        update: {p: c for scores in report.benchmarks.values() for p, c in scores.counts.items()}
        for update, report in sorted(record.evals.items())
    }


def points(counts: dict[str, int], n: int) -> np.ndarray:
    """Per-problem mean@n in points, in prompt-id order (one run, one evaluation)."""
    return 100.0 * np.array([counts[p] for p in sorted(counts)], dtype=float) / n


def selected(evaluations: dict, n: int) -> tuple[int, float]:
    """The run's checkpoint selected on validation (`best_update` of its mean@n) and its mean;
    ``evaluations``: update (int or str) -> counts."""
    means = {int(update): float(points(counts, n).mean()) for update, counts in evaluations.items()}
    update = best_update(means)
    return update, means[update]


def load_run(run_dir: Path, method: str, seed: int) -> RunRecord:
    """Read a finished run folder written by ``ggpo train`` (config.json, result.json, eval/, metrics)."""
    folder = RunFolder(run_dir)
    return RunRecord(
        method=method,
        seed=seed,
        run_dir=run_dir,
        settings=folder.read_settings(),
        result=folder.read_result(),
        evals=folder.read_evals(),
        metrics=folder.read_metrics(),
        tests=folder.read_tests(),
    )


def _started_on(record: RunRecord) -> tuple[str, str]:
    """(pool, data order) fingerprints of the data a run shares with the others: all it trained on, or,
    for a run that sampled rounds of its own (--sync-every), the pool and plan it started from."""
    if record.settings.sync_every in (None, record.settings.updates):
        return record.result.pool_fingerprint, record.result.data_order_fingerprint
    return record.settings.pool_fingerprint, record.settings.data_order_fingerprint


def check_data_plans(records: list[RunRecord]) -> dict[int, str]:
    """The data-order fingerprint of each seed (its first round's, for runs that sample rounds); UserError
    when runs of a seed (or the pool) disagree."""
    pools = {_started_on(r)[0] for r in records}
    if len(pools) > 1:
        raise UserError(f"the runs were trained on {len(pools)} different pools; refusing to report")
    plans: dict[int, str] = {}
    for record in records:
        fingerprint = _started_on(record)[1]
        first = plans.setdefault(record.seed, fingerprint)
        if fingerprint != first:
            others = [r for r in records if r.seed == record.seed]
            listing = ", ".join(f"{r.run_dir.name} {_started_on(r)[1][:12]}" for r in others)
            raise UserError(
                f"seed {record.seed}: the runs do not share one data plan ({listing}); refusing to report"
            )
    return plans
