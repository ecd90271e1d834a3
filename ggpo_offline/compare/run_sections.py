"""A comparison's run-derived README sections: what was compared, the pool, data plans, runs, settings and
the commands that reproduce it."""

import json
import shlex
from pathlib import Path

from ggpo_offline.compare import render
from ggpo_offline.compare.blocks import Code, Section, Table, number, prose
from ggpo_offline.compare.config import CompareConfig
from ggpo_offline.compare.render import ReportData, compare_scores, written_line
from ggpo_offline.compare.report import Report, RunRecord
from ggpo_offline.core.settings import leaf_values, leaves, to_flags
from ggpo_offline.jobs.config import LaunchConfig
from ggpo_offline.pool.inspect import pool_summary
from ggpo_offline.train.config import PER_RUN, TrainConfig
from ggpo_offline.train.metric_names import SAMPLER_FIELDS, SAMPLER_METRICS
from ggpo_offline.train.pool_index import CheckedPool
from ggpo_offline.train.training_presets import given_settings

LAUNCH_SETTINGS = ("jobs", "nproc", *(name for name in leaves(LaunchConfig)))
"""Where and how the runs ran: not part of what they compute, part of the command that continues a compare."""


def reproduce_command(config: CompareConfig, launch: bool = False) -> str:
    """The ``ggpo compare`` command of this comparison: its lists, then the training settings as given;
    with ``launch``, where its runs run too (the command that continues this very compare)."""
    words = ["ggpo", "compare", *to_flags(config, CompareConfig, only=("pool", "methods", "seeds"))]
    words += to_flags(config, CompareConfig, only=("preset", "config_file", "ceilings"))
    words += to_flags(config.settings, TrainConfig)
    words += to_flags(config, CompareConfig, only=("out",))
    if launch:
        given = {name: value for name, value in leaf_values(config).items() if name in LAUNCH_SETTINGS}
        defaults = leaf_values(CompareConfig())
        words += to_flags({k: v for k, v in given.items() if v != defaults[k]}, CompareConfig)
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
    pool: CheckedPool,
    planned,
    records: list[RunRecord],
    data_plans: dict[int, str],
    parent_run_id: str | None,
    report: Report,
) -> None:
    """The report's README (`render`): what was compared, the results (``report``, as computed), the
    statistics, then the sections the runs give, kept in report.json: the pool (``pool``, as compare read
    it), the data plans, the runs, their settings and the commands that reproduce it. ``planned``: compare's
    PlannedRun of each run, as ``records`` are ordered."""
    sections = [
        _heading(config),
        _pool(config, pool, planned[0].fingerprints.pool_fingerprint, records),
        _data_plans(data_plans, records),
        _runs(planned, records, parent_run_id),
        *_settings([run.config for run in planned]),
        _reproduce(config, planned),
    ]
    render.write_readme(config.report_dir, ReportData("compare", tuple(sections)), compare_scores(report))


def _heading(config: CompareConfig) -> Section:
    return Section(
        "heading",
        f"# Comparison on `{Path(config.pool).name}`",
        (
            prose(
                written_line(),
                f"Methods: {', '.join(config.methods)}; seeds: {', '.join(map(str, config.seeds))}.",
                "Within a seed every method replays the same minibatches in the same order (data-order"
                " fingerprints below); each minibatch is used once.",
            ),
        ),
    )


def _pool(config: CompareConfig, pool: CheckedPool, fingerprint: str, records: list[RunRecord]) -> Section:
    summary = pool_summary(pool.source)
    info = summary.info
    lines = (
        f"- file: `{config.pool}`",
        f"- fingerprint (sha256): `{fingerprint}`",
        f"- model: `{info.model.name}`, weights sha256 `{info.model.weights_sha256}`, engine dtype "
        f"`{info.dtype}`",
        f"- dataset: `{info.dataset_spec}`",
        f"- {summary.groups} groups × m = {info.sampling.m} = {summary.responses} "
        f"responses, mean reward {summary.mean_reward:.3f}, {summary.mixed_groups} mixed groups",
        f"- sampling: `{json.dumps(info.raw.get('sampling', {}), sort_keys=True)}`",
        *_sampler_line(records),
    )
    return Section("pool", "## Pool", (prose(*lines),))


def _sampler_line(records: list[RunRecord]) -> tuple[str, ...]:
    """The pool's sampler against the learner before any update, as the first run that measured it logged
    it at update 0 (every run on the pool measures the same responses); none before runs logged it."""
    logged = [row for record in records for row in record.metrics[:1] if SAMPLER_METRICS[0] in row]
    if not logged:
        return ()
    m = dict(zip(SAMPLER_FIELDS, (logged[0][name] for name in SAMPLER_METRICS), strict=True))
    return (
        f"- sampler against the learner before any update (`sampler/*` at update 0): mean |Δ log π| "
        f"{m['abs_log_ratio']:.3g}, K3 {m['k3']:.3g} (NeMo-RL's gen_kl_error), mean |π − μ| "
        f"{m['probs_diff']:.3g} (verl's rollout_probs_diff_mean), sequence ESS {m['ess']:.4f}, token ratio "
        f"p05 / p50 / p95 {m['ratio_p05']:.4f} / {m['ratio_p50']:.4f} / {m['ratio_p95']:.4f}, "
        f"{m['outside']:.2%} of token ratios outside [0.5, 2]",
    )


def _data_plans(data_plans: dict[int, str], records: list[RunRecord]) -> Section:
    rows = tuple(
        (number("{}", seed), f"`{fingerprint}`", number("{}", sum(r.seed == seed for r in records)))
        for seed, fingerprint in data_plans.items()
    )
    table = Table(("seed", "data-order fingerprint", "runs"), rows, "rlr")
    return Section("data plans", "## Data plans", (table,))


def _runs(planned, records: list[RunRecord], parent_run_id: str | None) -> Section:
    rows = tuple(
        (run.config.run_name, run.verbs.done, f"`{record.result.run_id}`", f"`{run.config.run_dir}`")
        for run, record in zip(planned, records, strict=True)
    )
    parent = "MLflow: not tracked (--no-tracking)."
    if parent_run_id:
        parent = f"MLflow parent run: `{parent_run_id}`"
    table = Table(("run", "this report", "MLflow run", "folder"), rows)
    return Section("runs", "## Runs", (prose(parent), table))


def _settings(runs: list[TrainConfig]) -> list[Section]:
    """The settings every run shares, then (when some differ beyond compare's own choices) those that
    differ, run by run."""
    configs = [run.to_dict() for run in runs]
    shared = {k: v for k, v in configs[0].items() if all(c[k] == v for c in configs) and k not in PER_RUN}
    varying = [k for k in configs[0] if k not in shared and k not in PER_RUN]
    table = Table(("setting", "value"), tuple((k, f"`{v}`") for k, v in shared.items()))
    sections = [Section("settings", "## Settings shared by every run", (table,))]
    if varying:
        rows = tuple(
            (run.run_name, *(f"`{c[k]}`" for k in varying)) for run, c in zip(runs, configs, strict=True)
        )
        sections.append(
            Section("settings", "## Settings that differ by run", (Table(("run", *varying), rows),))
        )
    return sections


def _reproduce(config: CompareConfig, planned) -> Section:
    blocks = (
        Code("bash", (reproduce_command(config),)),
        prose("Each run alone:"),
        Code("bash", tuple(train_command(run.config, config) for run in planned)),
    )
    return Section("reproduce", "## Reproduce", blocks)
