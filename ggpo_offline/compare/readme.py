"""The comparison report's README: pool, settings, data plans, runs, results and the commands that reproduce
them."""

import json
import shlex
from datetime import UTC, datetime
from pathlib import Path

from ggpo_offline import __version__
from ggpo_offline.compare.ceilings import CEILINGS_FILE
from ggpo_offline.compare.config import CompareConfig
from ggpo_offline.compare.counts import COUNTS_FILE
from ggpo_offline.compare.report import DIAGNOSTICS_FILE, STATISTICS
from ggpo_offline.core.settings import to_flags
from ggpo_offline.pool.info import PoolInfo
from ggpo_offline.pool.inspect import pool_summary
from ggpo_offline.train.config import PER_RUN, TrainConfig, given_settings


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
    words += to_flags({**shared, "eval_every": run.eval_every}, TrainConfig)
    return shlex.join(words + ["--out", str(run.run_dir)])


def write_readme(
    report_dir: Path, config: CompareConfig, planned, records, data_plans, parent_run_id
) -> None:
    """The report's README: pool, settings, data plans, runs, results and the commands to reproduce it.

    Long because it is the page's template, section by section in the order the README shows them."""
    summary = pool_summary(Path(config.pool))
    info = PoolInfo.from_metadata(summary.get("metadata", {}))
    configs = [run.config.to_dict() for run in planned]
    shared = {k: v for k, v in configs[0].items() if all(c[k] == v for c in configs) and k not in PER_RUN}
    varying = [k for k in configs[0] if k not in shared and k not in PER_RUN]
    lines = [
        f"# Comparison on `{Path(config.pool).name}`",
        "",
        f"Written by ggpo-offline {__version__} on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.",
        f"Methods: {', '.join(config.methods)}; seeds: {', '.join(map(str, config.seeds))}.",
        "Within a seed every method replays the same minibatches in the same order (data-order fingerprints"
        " below); each minibatch is used once.",
        "",
        "## Results",
        "",
        (report_dir / "table.md").read_text(),
        *([(report_dir / CEILINGS_FILE).read_text()] if (report_dir / CEILINGS_FILE).is_file() else []),
        "![validation accuracy, log ratio, ESS, gradient norm and entropy](figure.png)",
        "",
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
        "## Pool",
        "",
        f"- file: `{config.pool}`",
        f"- fingerprint (sha256): `{planned[0].fingerprints.pool_fingerprint}`",
        f"- model: `{info.model.name}`, weights sha256 `{info.model.weights_sha256}`",
        f"- dataset: `{info.dataset_spec}`",
        f"- {summary['groups']} groups × m = {info.sampling.m} = {summary['responses']} "
        f"responses, mean reward {summary['mean_reward']:.3f}, {summary['mixed_groups']} mixed groups",
        f"- sampling: `{json.dumps(info.raw.get('sampling', {}), sort_keys=True)}`",
        "",
        "## Data plans",
        "",
        "| seed | data-order fingerprint | runs |",
        "|---:|---|---:|",
    ]
    for seed, fingerprint in data_plans.items():
        lines.append(f"| {seed} | `{fingerprint}` | {sum(r.seed == seed for r in records)} |")
    lines += [
        "",
        "## Runs",
        "",
        f"MLflow parent run: `{parent_run_id}`" if parent_run_id else "MLflow: not tracked (--no-tracking).",
        "",
        "| run | this report | MLflow run | folder |",
        "|---|---|---|---|",
    ]
    for run, record in zip(planned, records, strict=True):
        verb = {"reuse": "reused", "resume": "resumed", "train": "trained", "replace": "retrained"}[
            run.action
        ]
        lines.append(
            f"| {run.config.run_name} | {verb} | `{record.result.run_id}` | `{run.config.run_dir}` |"
        )
    lines += [
        "",
        "## Settings shared by every run",
        "",
        "| setting | value |",
        "|---|---|",
        *[f"| {k} | `{v}` |" for k, v in shared.items()],
        "",
    ]
    if varying:
        lines += [
            "## Settings that differ by run",
            "",
            "| run | " + " | ".join(varying) + " |",
            "|---|" + "---|" * len(varying),
            *[
                f"| {run.config.run_name} | " + " | ".join(f"`{c[k]}`" for k in varying) + " |"
                for run, c in zip(planned, configs, strict=True)
            ],
            "",
        ]
    lines += [
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
    (report_dir / "README.md").write_text("\n".join(lines))
