"""`ggpo tune-report`: each learner's learning rate chosen on validation from a sweep of compare runs."""

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import ClassVar

import numpy as np

from ggpo_offline.compare import render, stats
from ggpo_offline.compare.arc import part_records
from ggpo_offline.compare.blocks import Block, Cell, Number, Section, Table, number, prose
from ggpo_offline.compare.config import TuneConfig
from ggpo_offline.compare.finished_runs import points, selected, validation_counts
from ggpo_offline.compare.render import ReportData, tuning_scores, written_line
from ggpo_offline.compare.report import DIAGNOSTICS_FILE, RunRecord, write_diagnostics
from ggpo_offline.compare.score_tables import display, rate_text
from ggpo_offline.core.errors import UserError, read_versioned
from ggpo_offline.train.learners import LEARNERS
from ggpo_offline.train.learners import SETTINGS as LEARNER_SETTINGS
from ggpo_offline.train.run_records import RunSettings

TUNING_FILE = "tuning.json"
"""Every sweep run's per-problem validation counts: the report is recomputed from it alone."""
SWEPT = ("method", "lr", "seed", "out", "data_order_fingerprint")
"""What differs between the runs of a sweep (a seed's data plan with it); a learner's own settings may too."""


def tune_report(config: TuneConfig) -> Path:
    """tuning.json and diagnostics.csv, then the README (`render`) with the tables computed from the first,
    into ``config.out``."""
    records = [record for part in config.parts for record in part_records(Path(part))]
    sweep = sweep_counts(records, config.parts)
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    sweep.write(out)
    write_diagnostics(records, out / DIAGNOSTICS_FILE, settings=("lr",))
    heading = (
        written_line(f" by `ggpo tune-report` from the runs of {', '.join(f'`{p}`' for p in config.parts)}"),
        _settings_line(RunSettings(sweep.settings), sweep.seeds),
    )
    title = "# Each learner's learning rate, chosen on validation"
    data = ReportData("tuning", (Section("heading", title, (prose(*heading),)),))
    render.write_readme(out, data, tuning_scores(tuning_tables(sweep)))
    return out


@dataclass(frozen=True)
class Sweep:
    """tuning.json: a learning-rate sweep's per-problem validation counts (`sweep_counts`), from which its
    tables are recomputed alone."""

    FORMATS: ClassVar[tuple[int, ...]] = (1, 2)
    """The layouts read, the last one written; format 1 (no "format" key) holds the same fields."""
    n: int
    """Samples per problem of every evaluation."""
    seeds: list[int]
    settings: dict
    """The training settings every run shares (config.json's, the swept and learner ones left out)."""
    runs: dict
    """learner -> rate text -> seed text -> update text -> prompt id -> correct count."""

    def write(self, folder: Path) -> None:
        record = {"format": self.FORMATS[-1], **asdict(self)}
        (folder / TUNING_FILE).write_text(json.dumps(record, indent=1) + "\n")

    @classmethod
    def read(cls, folder: Path) -> "Sweep":
        """The sweep written into ``folder``; UserError in one line where there is none."""
        missing = f"{folder}: no {TUNING_FILE}, the raw counts its report.json's scores come from"
        stored = read_versioned(folder / TUNING_FILE, cls.FORMATS, missing)
        return cls(**{f.name: stored[f.name] for f in fields(cls)})


def _settings_line(settings: RunSettings, seeds: list[int]) -> str:
    return (
        f"Every run: pool `{settings.pool}`, seeds {', '.join(map(str, seeds))},"
        f" U = {settings.updates} updates of"
        f" G = {settings.groups_per_batch} groups, validation {settings.eval_num_problems} problems ×"
        f" {settings.eval_n} every {settings.eval_every} updates,"
        f" {'no test evaluation' if settings.no_test else 'test evaluated but not read here'}."
        f" `{TUNING_FILE}` holds"
        " every evaluation's per-problem correct counts; the tables below are recomputed from it alone"
        " (`tests/test_tuning.py` checks the committed copy)."
    )


def sweep_counts(records: list[RunRecord], parts: tuple[str, ...]) -> Sweep:
    """The `Sweep` (learners in the registry's order, rates ascending, seeds as first met) of the finished
    runs of the sweep (read from ``parts``), which must differ only in learner (and its own settings),
    learning rate and seed, with every learner at every rate run for the same seeds."""
    runs: dict[str, dict[str, dict]] = {}
    shared, n = None, None
    for record in records:
        lr, seed = rate_text(record.settings.lr), str(record.seed)
        if seed in runs.get(record.method, {}).get(lr, {}):
            raise UserError(f"{record.method} at lr {lr}, seed {seed} is in two of the parts")
        # Each learner keeps its own hyperparameters (and reference schedule); all else is the sweep's.
        settings = record.settings.without((*SWEPT, *LEARNER_SETTINGS))
        if shared is not None and settings != shared:
            differing = sorted(k for k in settings if settings[k] != shared.get(k))
            raise UserError(
                f"{record.run_dir}: the sweep's runs differ in more than learner, lr and seed"
                f" ({', '.join(differing)})"
            )
        shared = settings
        n = record.evals[0].n
        runs.setdefault(record.method, {}).setdefault(lr, {})[seed] = {
            str(update): merged for update, merged in validation_counts(record).items()
        }
    if not runs:
        raise UserError(f"no finished run in {', '.join(parts)}")
    seeds = list(
        dict.fromkeys(seed for by_lr in runs.values() for by_seed in by_lr.values() for seed in by_seed)
    )
    for method, by_lr in runs.items():
        for lr, by_seed in by_lr.items():
            missing = [seed for seed in seeds if seed not in by_seed]
            if missing:
                raise UserError(f"{method} at lr {lr} has no finished run of seed {', '.join(missing)}")
    ordered = {
        method: {
            lr: {seed: runs[method][lr][seed] for seed in seeds} for lr in sorted(runs[method], key=float)
        }
        for method in LEARNERS
        if method in runs
    }
    return Sweep(n, [int(seed) for seed in seeds], shared, ordered)


def rate_mean(by_seed: dict[str, dict], n: int) -> float:
    """A learner's validation mean@n at one rate: the mean over seeds of each run's selected checkpoint."""
    return float(np.mean([selected(evaluations, n)[1] for evaluations in by_seed.values()]))


def _selected_counts(by_seed: dict[str, dict], n: int) -> np.ndarray:
    """Correct counts [seeds, problems] at each run's selected checkpoint (prompt-id order)."""
    rows = []
    for evaluations in by_seed.values():
        counts = evaluations[str(selected(evaluations, n)[0])]
        rows.append([counts[p] for p in sorted(counts)])
    return np.array(rows)


def chosen_rates(sweep: Sweep) -> dict[str, float]:
    """Each learner's rate: the one whose runs reach the highest validation mean@n at their selected
    checkpoints (mean over seeds), the smaller rate among equals."""
    n, chosen = sweep.n, {}
    for method, by_lr in sweep.runs.items():
        lrs = sorted(by_lr, key=float)
        chosen[method] = float(max(lrs, key=lambda lr: (rate_mean(by_lr[lr], n), -float(lr))))
    return chosen


def tuning_tables(sweep: Sweep) -> list[Block]:
    """Each learner's selected validation mean@n per rate, the chosen rate and its paired
    difference to the runner-up (one Holm family over the learners); then every evaluation, mean over
    seeds."""
    n, runs, seeds = sweep.n, sweep.runs, sweep.seeds
    lrs = sorted({lr for by_lr in runs.values() for lr in by_lr}, key=float)
    chosen = {method: rate_text(lr) for method, lr in chosen_rates(sweep).items()}
    margins = _margins(runs, chosen, n)
    table_rows = []
    for method, by_lr in runs.items():
        cells = []
        for lr in lrs:
            if lr not in by_lr:
                cells.append("–")
                continue
            updates = "/".join(str(selected(evaluations, n)[0]) for evaluations in by_lr[lr].values())
            cell = number("{:.2f} ({})", rate_mean(by_lr[lr], n), updates)
            cells.append(cell.within("**", "**") if lr == chosen[method] else cell)
        edge = " (grid edge)" if chosen[method] in (lrs[0], lrs[-1]) and len(lrs) > 2 else ""
        table_rows.append((display(method), *cells, f"{chosen[method]}{edge}", margins.get(method, "–")))
    header = ("learner", *(f"lr {lr}" for lr in lrs), "chosen", "chosen − runner-up [95 %]")
    blocks = [
        prose(
            f"### Validation mean@{n} (%) at each run's selected checkpoint, mean over seeds"
            f" {', '.join(map(str, seeds))} (selected update per seed)"
        ),
        Table(header, tuple(table_rows), "l" + "r" * (len(lrs) + 1) + "l"),
        prose(
            "The chosen rate is the one whose runs reach the highest validation mean@n at their selected"
            " checkpoints, averaged over seeds (the smaller rate among equals). The difference to the"
            " runner-up rate is paired by seed and problem at each run's selected checkpoint, calibrated for"
            " the seeds (`compare/stats.py`) and Holm-adjusted over the learners' differences as one family."
            " **resolved**: the chosen rate beats the runner-up on validation; **not resolved**: these seeds"
            " cannot tell the two rates apart, and the choice is only the higher mean; **too few seeds**: one"
            " seed, an interval over problems that describes those two runs. The same runs choose the rate"
            " and measure its margin, so the margin leans optimistic. (grid edge): the best rate is the"
            " grid's largest or smallest."
        ),
        prose(f"### Every validation evaluation: mean@{n} (%) by update, mean over seeds"),
    ]
    updates = sorted(
        {
            int(u)
            for by_lr in runs.values()
            for by_seed in by_lr.values()
            for ev in by_seed.values()
            for u in ev
        }
    )
    table_rows = []
    for method, by_lr in runs.items():
        for lr, by_seed in by_lr.items():
            means = [_update_mean(by_seed, str(u), n) for u in updates]
            table_rows.append((display(method), lr, *means))
    header = ("learner", "lr", *map(str, updates))
    return [*blocks, Table(header, tuple(table_rows), "lr" + "r" * len(updates))]


def _update_mean(by_seed: dict[str, dict], update: str, n: int) -> Cell:
    if any(update not in evaluations for evaluations in by_seed.values()):
        return "–"
    return number("{:.2f}", float(np.mean([points(ev[update], n).mean() for ev in by_seed.values()])))


def _margins(runs: dict[str, dict], chosen: dict[str, str], n: int) -> dict[str, Number]:
    """Each learner's chosen rate minus its runner-up (the next-highest mean), with its interval and its
    verdict in the family of every learner's margin."""
    pairs = {}
    for method, by_lr in runs.items():
        others = [lr for lr in by_lr if lr != chosen[method]]
        if others:
            runner_up = max(others, key=lambda lr: rate_mean(by_lr[lr], n))
            best, other = (_selected_counts(by_lr[lr], n) for lr in (chosen[method], runner_up))
            pairs[method] = (runner_up, stats.difference(best, other, n))
    judged = stats.judge([interval for _, interval in pairs.values()])
    return {
        method: verdict.number().within(f"− {runner_up}: ")
        for (method, (runner_up, _)), verdict in zip(pairs.items(), judged, strict=True)
    }
