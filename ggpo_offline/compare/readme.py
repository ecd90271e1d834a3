"""The comparison report's README: pool, settings, data plans, runs, results and the commands that reproduce
them."""

import json
import shlex
from datetime import UTC, datetime
from pathlib import Path

from ggpo_offline import __version__
from ggpo_offline.compare.config import CompareConfig
from ggpo_offline.compare.counts import COUNTS_FILE
from ggpo_offline.compare.report import DIAGNOSTICS_FILE, STATISTICS, Report, RunRecord
from ggpo_offline.core import markdown
from ggpo_offline.core.settings import to_flags
from ggpo_offline.pool.inspect import pool_summary
from ggpo_offline.train.config import PER_RUN, TrainConfig
from ggpo_offline.train.training_presets import given_settings


def reproduce_command(config: CompareConfig) -> str:
    """The ``ggpo compare`` command of this comparison: its lists, then the training settings as given."""
    words = ["ggpo", "compare", *to_flags(config, CompareConfig, only=("pool", "methods", "seeds"))]
    words += to_flags(config, CompareConfig, only=("preset", "config_file", "ceilings"))
    words += to_flags(config.settings, TrainConfig)
    words += to_flags(config, CompareConfig, only=("out",))
    return shlex.join(words)


def train_command(run: TrainConfig, config: CompareConfig) -> str:
    """The ``ggpo train`` command of one run: its own settings, then the comparison's shared ones that its
    learner reads. A shared config file's settings are written out as flags: ``--config`` would also give
    the settings other compared learners read, which ``ggpo train`` refuses for this one."""
    shared = run.learner.keep_read(given_settings(config.config_file, config.settings))
    words = ["ggpo", "train", *to_flags(run, TrainConfig, only=("pool", "method", "seed"))]
    words += to_flags(config, CompareConfig, only=("preset",))
    words += to_flags({**shared, "eval_every": run.evaluation.eval_every}, TrainConfig)
    return shlex.join(words + ["--out", str(run.run_dir)])


def write_readme(
    config: CompareConfig,
    planned,
    records: list[RunRecord],
    data_plans: dict[int, str],
    parent_run_id: str | None,
    report: Report,
) -> None:
    """The report's README, section by section in the order it shows them: what was compared, the results
    (``report``, as computed), the statistics, the pool, the data plans, the runs, their settings and the
    commands that reproduce it. ``planned``: compare's PlannedRun of each run, as ``records`` are ordered."""
    sections = [
        _heading(config),
        _results(report),
        _statistics(),
        _pool(config, planned[0].fingerprints.pool_fingerprint),
        _data_plans(data_plans, records),
        _runs(planned, records, parent_run_id),
        _settings([run.config for run in planned]),
        _reproduce(config, planned),
    ]
    (config.report_dir / "README.md").write_text("\n".join(line for lines in sections for line in lines))


def _heading(config: CompareConfig) -> list[str]:
    return [
        f"# Comparison on `{Path(config.pool).name}`",
        "",
        f"Written by ggpo-offline {__version__} on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.",
        f"Methods: {', '.join(config.methods)}; seeds: {', '.join(map(str, config.seeds))}.",
        "Within a seed every method replays the same minibatches in the same order (data-order fingerprints"
        " below); each minibatch is used once.",
        "",
    ]


def _results(report: Report) -> list[str]:
    return [
        "## Results",
        "",
        report.tables,
        *([report.ceilings] if report.ceilings else []),
        "![validation accuracy, log ratio, ESS, gradient norm and entropy](figure.png)",
        "",
    ]


def _statistics() -> list[str]:
    return [
        "## Statistics",
        "",
        STATISTICS,
        "",
        f"Files: `table.md` and `table.csv` (every number above), `{COUNTS_FILE}` (the per-problem correct"
        " counts of every evaluation, validation and test, from which both tables are recomputed exactly:"
        " `write_tables(Counts.read(path), folder)` with both from `ggpo_offline.compare.report`),"
        f" `{DIAGNOSTICS_FILE}` (every run's drift, K3, ESS, entropy and gradient norm per update),"
        " `figure.png` and one PNG per panel.",
        "",
    ]


def _pool(config: CompareConfig, fingerprint: str) -> list[str]:
    summary = pool_summary(Path(config.pool))
    info = summary.info
    return [
        "## Pool",
        "",
        f"- file: `{config.pool}`",
        f"- fingerprint (sha256): `{fingerprint}`",
        f"- model: `{info.model.name}`, weights sha256 `{info.model.weights_sha256}`",
        f"- dataset: `{info.dataset_spec}`",
        f"- {summary.groups} groups × m = {info.sampling.m} = {summary.responses} "
        f"responses, mean reward {summary.mean_reward:.3f}, {summary.mixed_groups} mixed groups",
        f"- sampling: `{json.dumps(info.raw.get('sampling', {}), sort_keys=True)}`",
        "",
    ]


def _data_plans(data_plans: dict[int, str], records: list[RunRecord]) -> list[str]:
    rows = [
        (seed, f"`{fingerprint}`", sum(r.seed == seed for r in records))
        for seed, fingerprint in data_plans.items()
    ]
    return ["## Data plans", "", *markdown.table(["seed", "data-order fingerprint", "runs"], rows, "rlr"), ""]


def _runs(planned, records: list[RunRecord], parent_run_id: str | None) -> list[str]:
    rows = [
        (run.config.run_name, run.verbs.done, f"`{record.result.run_id}`", f"`{run.config.run_dir}`")
        for run, record in zip(planned, records, strict=True)
    ]
    return [
        "## Runs",
        "",
        f"MLflow parent run: `{parent_run_id}`" if parent_run_id else "MLflow: not tracked (--no-tracking).",
        "",
        *markdown.table(["run", "this report", "MLflow run", "folder"], rows),
        "",
    ]


def _settings(runs: list[TrainConfig]) -> list[str]:
    """The settings every run shares, then (when some differ beyond compare's own choices) those that
    differ, run by run."""
    configs = [run.to_dict() for run in runs]
    shared = {k: v for k, v in configs[0].items() if all(c[k] == v for c in configs) and k not in PER_RUN}
    varying = [k for k in configs[0] if k not in shared and k not in PER_RUN]
    lines = [
        "## Settings shared by every run",
        "",
        *markdown.table(["setting", "value"], [(k, f"`{v}`") for k, v in shared.items()]),
        "",
    ]
    if varying:
        rows = [[run.run_name, *(f"`{c[k]}`" for k in varying)] for run, c in zip(runs, configs, strict=True)]
        lines += ["## Settings that differ by run", "", *markdown.table(["run", *varying], rows), ""]
    return lines


def _reproduce(config: CompareConfig, planned) -> list[str]:
    return [
        "## Reproduce",
        "",
        "```bash",
        reproduce_command(config),
        "```",
        "",
        "Each run alone:",
        "",
        "```bash",
        *[train_command(run.config, config) for run in planned],
        "```",
        "",
    ]
