"""`ggpo tune-report`: each learner's learning rate chosen on validation from a sweep of compare runs."""

import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from ggpo_offline import __version__
from ggpo_offline.compare import stats
from ggpo_offline.compare.arc import part_records
from ggpo_offline.compare.config import TuneConfig
from ggpo_offline.compare.report import DIAGNOSTICS_FILE, RunRecord, write_diagnostics
from ggpo_offline.compare.runs import validation_counts
from ggpo_offline.compare.tables import display, interval_verdict, rate_text
from ggpo_offline.core import markdown
from ggpo_offline.core.errors import UserError
from ggpo_offline.train.learners import METHODS
from ggpo_offline.train.learners import SETTINGS as LEARNER_SETTINGS

TUNING_FILE = "tuning.json"
"""Every sweep run's per-problem validation counts: the report is recomputed from it alone."""
SWEPT = ("method", "lr", "out")
"""What differs between the runs of a sweep; a learner's own settings may too."""


def tune_report(config: TuneConfig) -> Path:
    """tuning.json and diagnostics.csv, then the README's tables computed from the first, into
    ``config.out``."""
    records = [record for part in config.parts for record in part_records(Path(part))]
    sweep = sweep_counts(records, config.parts)
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    (out / TUNING_FILE).write_text(json.dumps(sweep, indent=1) + "\n")
    write_diagnostics(records, out / DIAGNOSTICS_FILE, settings=("lr",))
    sections = [
        "# Each learner's learning rate, chosen on validation (`make tune-lr`)",
        "",
        f"Written by ggpo-offline {__version__} on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by"
        f" `ggpo tune-report` from the runs of {', '.join(f'`{p}`' for p in config.parts)}.",
        _settings_line(sweep["settings"]),
        "",
        tuning_tables(sweep),
    ]
    (out / "README.md").write_text("\n".join(sections))
    return out


def _settings_line(settings: dict) -> str:
    return (
        f"Every run: pool `{settings['pool']}`, seed {settings['seed']}, U = {settings['updates']} updates of"
        f" G = {settings['groups_per_batch']} groups, validation {settings['eval_num_problems']} problems ×"
        f" {settings['eval_n']} every {settings['eval_every']} updates,"
        f" {'no test evaluation' if settings.get('no_test') else 'test evaluated but not read here'}."
        f" `{TUNING_FILE}` holds"
        " every evaluation's per-problem correct counts; the tables below are recomputed from it alone"
        " (`tests/test_tuning.py` checks the committed copy)."
    )


def sweep_counts(records: list[RunRecord], parts: tuple[str, ...]) -> dict:
    """``{"n": n, "settings": ..., "runs": {method: {lr: {update: {prompt_id: correct}}}}}`` (learners in the
    registry's order, rates ascending) from the finished runs of the sweep (read from ``parts``), which must
    differ only in learner (and its own settings) and learning rate (one seed)."""
    runs: dict[str, dict[str, dict]] = {}
    shared, n = None, None
    for record in records:
        lr = rate_text(record.config["lr"])
        if lr in runs.get(record.method, {}):
            raise UserError(f"{record.method} at lr {lr} is in two of the parts")
        # Each learner keeps its own hyperparameters (and reference schedule); all else is the sweep's.
        settings = {k: v for k, v in record.config.items() if k not in (*SWEPT, *LEARNER_SETTINGS)}
        if shared is not None and settings != shared:
            differing = sorted(k for k in settings if settings[k] != shared.get(k))
            raise UserError(
                f"{record.run_dir}: the sweep's runs differ in more than learner and lr"
                f" ({', '.join(differing)})"
            )
        shared = settings
        n = record.evals[0].n
        runs.setdefault(record.method, {})[lr] = {
            str(update): merged for update, merged in validation_counts(record).items()
        }
    if not runs:
        raise UserError(f"no finished run in {', '.join(parts)}")
    ordered = {
        method: dict(sorted(runs[method].items(), key=lambda item: float(item[0])))
        for method in METHODS
        if method in runs
    }
    return {"n": n, "settings": shared, "runs": ordered}


def _points(counts: dict[str, int], n: int) -> np.ndarray:
    """Per-problem mean@n in points, ``[1, problems]`` in prompt-id order (one seed)."""
    return 100.0 * np.array([[counts[p] for p in sorted(counts)]], dtype=float) / n


def selected(evaluations: dict[str, dict[str, int]], n: int) -> tuple[int, float]:
    """The run's checkpoint selected on validation (best mean@n, the earliest among equals) and its mean."""
    means = {int(update): float(_points(counts, n).mean()) for update, counts in evaluations.items()}
    update = max(sorted(means), key=lambda u: (means[u], -u))
    return update, means[update]


def chosen_rates(sweep: dict) -> dict[str, float]:
    """Each learner's rate: the one whose run reaches the highest validation mean@n at its selected
    checkpoint, the smaller rate among equals."""
    n, chosen = sweep["n"], {}
    for method, by_lr in sweep["runs"].items():
        lrs = sorted(by_lr, key=float)
        chosen[method] = float(max(lrs, key=lambda lr: (selected(by_lr[lr], n)[1], -float(lr))))
    return chosen


def tuning_tables(sweep: dict) -> str:
    """Markdown: each learner's selected validation mean@n per rate, the chosen rate and its paired
    difference to the runner-up; then every evaluation of every run."""
    n, runs = sweep["n"], sweep["runs"]
    lrs = sorted({lr for by_lr in runs.values() for lr in by_lr}, key=float)
    chosen = chosen_rates(sweep)
    seed = sweep["settings"]["seed"]
    table_rows = []
    for method, by_lr in runs.items():
        best = rate_text(chosen[method])
        cells = []
        for lr in lrs:
            if lr not in by_lr:
                cells.append("–")
                continue
            update, mean = selected(by_lr[lr], n)
            cell = f"{mean:.2f} ({update})"
            cells.append(f"**{cell}**" if lr == best else cell)
        edge = " (grid edge)" if best in (lrs[0], lrs[-1]) and len(lrs) > 2 else ""
        margin = _margin(by_lr, best, n)
        table_rows.append([display(method), *cells, f"{best}{edge}", margin])
    header = ["learner", *(f"lr {lr}" for lr in lrs), "chosen", "chosen − runner-up [95 %]"]
    lines = [
        f"### Validation mean@{n} (%) at each run's selected checkpoint (update), seed {seed}",
        "",
        *markdown.table(header, table_rows, "l" + "r" * (len(lrs) + 1) + "l"),
        "",
        "The chosen rate is the one whose run reaches the highest validation mean@n at its selected"
        " checkpoint (the smaller rate among equals): the higher validation mean, not a resolved difference."
        " The difference to the runner-up is paired by problem at both runs' selected checkpoints; with one"
        " seed its interval is over problems only and describes those two runs, so its verdict is **too few"
        " seeds** (`compare/stats.py`): a rate is a choice made on validation, not a finding. (grid edge):"
        " the best rate is the grid's largest or smallest.",
        "",
        f"### Every validation evaluation: mean@{n} (%) by update",
        "",
    ]
    updates = sorted({int(u) for by_lr in runs.values() for ev in by_lr.values() for u in ev})
    table_rows = []
    for method, by_lr in runs.items():
        for lr in sorted(by_lr, key=float):
            means = [
                f"{_points(by_lr[lr][str(u)], n).mean():.2f}" if str(u) in by_lr[lr] else "–" for u in updates
            ]
            table_rows.append([display(method), lr, *means])
    lines += markdown.table(["learner", "lr", *updates], table_rows, "lr" + "r" * len(updates))
    return "\n".join(lines + [""])


def _margin(by_lr: dict[str, dict], best: str, n: int) -> str:
    """The chosen rate's selected checkpoint minus the runner-up's, with its interval and verdict."""
    others = [lr for lr in by_lr if lr != best]
    if not others:
        return "–"
    runner_up = max(others, key=lambda lr: selected(by_lr[lr], n)[1])
    best_update, _ = selected(by_lr[best], n)
    other_update, _ = selected(by_lr[runner_up], n)
    interval = stats.paired_interval(
        _points(by_lr[best][str(best_update)], n) - _points(by_lr[runner_up][str(other_update)], n)
    )
    return f"− {runner_up}: {interval_verdict(interval)}"
