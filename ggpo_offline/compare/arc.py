"""`ggpo arc-report`: the offline arc (docs/arc/) from runs that several compares trained side by side — the
comparison report, the ablations beside the default settings, and the style shares along the arc."""

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ggpo_offline.compare import render, stats
from ggpo_offline.compare.against_ceilings import read_ceilings
from ggpo_offline.compare.blocks import Block, Section, Table, markdown_text, number, prose
from ggpo_offline.compare.config import ArcConfig
from ggpo_offline.compare.counts import Counts
from ggpo_offline.compare.finished_runs import (
    RunRecord,
    check_data_plans,
    load_run,
    points,
    selected,
    validation_counts,
)
from ggpo_offline.compare.manifest import MARKER, CompareManifest
from ggpo_offline.compare.render import ReportData, arc_scores, written_line
from ggpo_offline.compare.report import Report, write_report
from ggpo_offline.compare.score_tables import display, rate_text
from ggpo_offline.core.errors import UserError, replace_text, stored_format, write_json
from ggpo_offline.generate.engines.base import EngineName
from ggpo_offline.pool.source import read_pool_info
from ggpo_offline.train.learners import learner
from ggpo_offline.train.run_folder import RunFolder
from ggpo_offline.train.run_records import RunId

ABLATIONS_FILE = "ablations.md"
ABLATIONS_COUNTS = "ablations.json"
ABLATIONS_FORMAT = "ggpo-offline ablations 1"
STYLES_FILE = "styles.md"


def arc_report(config: ArcConfig) -> Path:
    """Write the arc's report into ``config.out``: tables (`write_report`), ceilings.md (with ``--ceilings``),
    ablations.md and styles.md."""
    ceilings = read_ceilings(config.ceilings)  # a bad file is refused before the slow style measures
    records = _records(config.parts, config.methods, config.seeds)
    check_data_plans(records)
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    report = write_report(records, list(config.methods), list(config.seeds), out, ceilings)
    if config.ablations is not None:
        write_ablation_runs(out, ablation_runs(_ablation_parts(config.ablations)))
    ablations = write_ablations(out, report.counts)  # else the folder's earlier ablation runs, if any
    by_run = {(r.method, r.seed): r for r in records}
    chosen = [by_run[(m, config.styles_seed)] for m in config.methods if (m, config.styles_seed) in by_run]
    styles = styles_along(chosen, config.styles_problems, out / "styles.json", config.styles_engine)
    replace_text(out / STYLES_FILE, markdown_text(styles))
    write_readme(config, records, report, ablations, styles)
    return out


def write_ablations(folder: Path, counts: Counts) -> list[Block]:
    """ablations.md recomputed from the folder's ablations.json and ``counts``; its blocks (none where the
    folder holds no ablation runs)."""
    runs = read_ablation_runs(folder)
    if runs is None:
        return []
    ablations = ablation_table(counts, runs)
    replace_text(folder / ABLATIONS_FILE, markdown_text(ablations))
    return ablations


def write_readme(
    config: ArcConfig, records: list[RunRecord], report: Report, ablations: list[Block], styles: list[Block]
) -> None:
    """The arc's README (`render`): what ran and the style shares, kept in report.json, with the tables
    (``report``), the ablations and how to recompute them."""
    settings = records[0].settings
    info = read_pool_info(settings.pool)
    refresh = [r.settings.ref_refresh for r in records if r.settings.ref_refresh is not None]
    rates = {display(r.method): rate_text(r.settings.lr) for r in records}
    one_rate = len(set(rates.values())) == 1
    lr = rates.popitem()[1] if one_rate else "per learner " + ", ".join(f"{m} {v}" for m, v in rates.items())
    heading = (
        written_line(f" by `ggpo arc-report` from the runs of {', '.join(f'`{p}`' for p in config.parts)}"),
        f"Methods: {', '.join(display(m) for m in config.methods)};"
        f" seeds {', '.join(map(str, config.seeds))};"
        f" pool `{settings.pool}` ({info.model.name}, `{info.dataset_spec}`, m = {info.sampling.m});"
        f" U = {settings.updates} updates of G = {settings.groups_per_batch} groups, lr {lr},"
        f" β {settings.beta}, T_ref {refresh[0] if refresh else 'never'} (learners"
        " that refresh π_ref), validation"
        f" evaluation every {settings.eval_every} updates ({settings.eval_num_problems} problems ×"
        f" {settings.eval_n}), test once per run at the end ({settings.test_num_problems} problems).",
        "Within a seed every method replays the same minibatches in the same order.",
    )
    sections = [
        Section("heading", "# The offline arc on the embedded model (`make arc`)", (prose(*heading),))
    ]
    if styles:
        sections.append(Section("styles", "## What the learners select", tuple(styles)))
    render.write_readme(config.out, ReportData("arc", tuple(sections)), arc_scores(report, ablations))


def part_records(part: Path) -> list[RunRecord]:
    """The finished runs a compare report folder lists in its marker."""
    records = []
    for run, folder in CompareManifest.read(part).run_folders().items():
        if not RunFolder(folder).is_finished():  # a compare stopped early lists it all the same
            continue
        records.append(load_run(folder, run.method, run.seed))
    return records


def _records(parts: tuple[str, ...], methods: tuple[str, ...], seeds: tuple[int, ...]) -> list[RunRecord]:
    """Every method x seed run, seed-major, from the parts' runs; UserError for a missing or doubled run."""
    found: dict[tuple[str, int], RunRecord] = {}
    for part in parts:
        for record in part_records(Path(part)):
            key = (record.method, record.seed)
            if key in found:
                raise UserError(f"{record.method} seed {record.seed} is in two of the parts")
            found[key] = record
    missing = [RunId(m, s).folder_name for s in seeds for m in methods if (m, s) not in found]
    if missing:
        raise UserError(f"the parts hold no finished run {', '.join(missing)}")
    return [found[(m, s)] for s in seeds for m in methods]


def _ablation_parts(folder: Path) -> dict[str, list[RunRecord]]:
    """Each ablation's runs by its folder name (e.g. beta-0.003)."""
    return {p.name: part_records(p) for p in sorted(folder.iterdir()) if (p / MARKER).is_file()}


@dataclass(frozen=True)
class AblationRun:
    """One ablation run's per-problem validation counts: a run of ablations.json."""

    setting: str
    """The ablation's folder name (``beta-0.003``)."""
    method: str
    seed: int
    n: int
    evaluations: dict[str, dict[str, int]]
    """update (text) -> prompt id -> correct count."""


def write_ablation_runs(folder: Path, runs: list[AblationRun]) -> None:
    """ablations.json: the ablation runs' validation counts (`ablation_runs`), with its format."""
    record = {"format": ABLATIONS_FORMAT, "runs": [asdict(run) for run in runs]}
    replace_text(folder / ABLATIONS_COUNTS, json.dumps(record, indent=1) + "\n")


def read_ablation_runs(folder: Path) -> list[AblationRun] | None:
    """The ablation runs `write_ablation_runs` wrote into ``folder``; None where it holds none; UserError
    for a file of another format."""
    path = folder / ABLATIONS_COUNTS
    if not path.is_file():
        return None
    stored = json.loads(path.read_text())
    stored_format(stored, (ABLATIONS_FORMAT,), path)
    return [AblationRun(**run) for run in stored["runs"]]


def evaluation_counts(counts: Counts, method: str, seed: int) -> dict[str, dict[str, int]]:
    """One default run's validation evaluations from counts.json: update (a string, as in ablations.json)
    -> prompt id -> correct."""
    prompts = counts.prompts["validation"]
    found = {}
    for (m, s, split, update), by_benchmark in counts.correct.items():
        if (m, s, split) == (method, seed, "validation"):
            pairs = (zip(ids, by_benchmark[name], strict=True) for name, ids in prompts.items())
            found[str(update)] = {p: c for pair in pairs for p, c in pair}
    return dict(sorted(found.items(), key=lambda item: int(item[0])))


def ablation_runs(ablations: dict[str, list[RunRecord]]) -> list[AblationRun]:
    """Every ablation run's per-problem validation counts (ablations.json: the ablation table is recomputed
    from them and the default runs' counts.json)."""
    return [
        AblationRun(
            name,
            record.method,
            record.seed,
            record.evals[0].n,
            {str(u): merged for u, merged in validation_counts(record).items()},
        )
        for name, records in ablations.items()
        for record in records
    ]


def ablation_table(counts: Counts, ablations: list[AblationRun]) -> list[Block]:
    """The paper's Table 6 axes on validation: each setting beside the default runs of the same method and
    seeds (from ``counts``; an ablation learner beside the learner it ablates), at each run's final and peak
    (selected) checkpoint: the means over the seeds both have, the setting's own fall (peak − final, paired
    within each run: does it still collapse?) and the paired differences setting − default, seed-calibrated
    (`stats.difference`); each column's rows are one Holm family, and a row of one seed is "too few
    seeds"."""
    n = counts.n["validation"]
    arms: dict[tuple[str, str], list[tuple[int, dict, dict]]] = {}
    for run in ablations:
        method = learner(run.method).ablates or run.method  # an ablation learner beside its learner
        if method in counts.methods and run.seed in counts.seeds:
            default = evaluation_counts(counts, method, run.seed)
            arms.setdefault((run.setting, run.method), []).append((run.seed, run.evaluations, default))
    rows, falls, finals, peaks = [], [], [], []
    for (setting, method), runs in arms.items():
        ablated, default = [r[1] for r in runs], [r[2] for r in runs]
        at_peak, at_final = _at(ablated, _peak, n), _at(ablated, _final, n)
        falls.append(stats.difference(at_peak, at_final, n))
        finals.append(stats.difference(at_final, _at(default, _final, n), n))
        peaks.append(stats.difference(at_peak, _at(default, _peak, n), n))
        updates = ", ".join(_peak(evaluations, n) for evaluations in ablated)
        means = (_mean(ablated, _peak, n), _mean(ablated, _final, n))
        peak = number("{:.2f} ({})", means[0], updates)
        rows.append([setting, display(method), number("{}", len(runs)), peak, number("{:.2f}", means[1])])
    for row, *judged in zip(rows, *map(stats.judge, (falls, finals, peaks)), strict=True):
        row += [interval.number() for interval in judged]
    header = ("setting", "method", "seeds", "peak (updates)", "final", "peak − final [95 %]")
    header += ("final − default final [95 %]", "peak − default peak [95 %]")
    return [
        prose(
            "### Ablations on validation (mean@n %, mean over seeds): peak and final beside the default"
            " settings"
        ),
        Table(header, tuple(map(tuple, rows)), "llrrrrrr"),
        prose(_defaults_line(arms, n)),
    ]


def _final(evaluations: dict[str, dict[str, int]], n: int) -> str:
    """The key of the run's last evaluation."""
    return max(evaluations, key=int)


def _peak(evaluations: dict[str, dict[str, int]], n: int) -> str:
    """The key of the run's checkpoint chosen on validation (`selected`)."""
    return str(selected(evaluations, n)[0])


def _at(runs: list[dict], checkpoint: Callable, n: int) -> np.ndarray:
    """Correct counts [seeds, problems] (prompt-id order) at each run's ``checkpoint``."""
    chosen = [evaluations[checkpoint(evaluations, n)] for evaluations in runs]
    return np.array([[counts[p] for p in sorted(counts)] for counts in chosen])


def _mean(runs: list[dict], checkpoint: Callable, n: int) -> float:
    """mean@n in points at each run's ``checkpoint``, averaged over the runs (seeds)."""
    return float(np.mean([points(evaluations[checkpoint(evaluations, n)], n).mean() for evaluations in runs]))


def _defaults_line(arms: dict[tuple[str, str], list[tuple[int, dict, dict]]], n: int) -> str:
    shown = {}
    for (_, method), runs in arms.items():
        method = learner(method).ablates or method
        seeds, default = tuple(r[0] for r in runs), [r[2] for r in runs]
        shown[(method, seeds)] = (
            f"{display(method)} seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}: peak"
            f" {_mean(default, _peak, n):.2f}, final {_mean(default, _final, n):.2f}"
        )
    return (
        "Default settings (the arc preset), on the same seeds: " + "; ".join(shown.values()) + ". Each"
        " difference is paired by seed and problem, its interval t on seeds − 1 df (`compare/stats.py`), and"
        " each column's rows are one family (Holm). A row of one seed is over problems only and describes the"
        " two runs: too few seeds for a verdict about the setting. peak − final is the setting's own fall"
        " from its best validation evaluation; the peak is a maximum over evaluations, so the fall leans high"
        " (a small one resolved is weak evidence; none at all, [+0.00, +0.00], is the peak being the last)."
    )


def styles_along(
    records: list[RunRecord], problems: int, json_out: Path, engine_name: EngineName
) -> list[Block]:
    """`measure-styles --no-forced` on validation at update 0, each run's selected checkpoint and its final
    one: which behaviours a learner moves to, including output no style of the pool opens with ("other").
    ``engine_name`` vllm: one engine samples for every checkpoint (hf: `generate` per checkpoint)."""
    from ggpo_offline.organism.measure import measure_styles

    measured: dict[str, dict] = {}
    initial = Path(records[0].evals[0].settings.model.path)  # what update 0 evaluated
    rows = [("base model", 0, initial), *_checkpoints(records)]
    engine = _styles_engine(engine_name, initial)
    try:
        for label, update, model_dir in rows:
            settings = {"n_problems": problems, "forced": False, "split": "validation", "engine": engine}
            measured[f"{label} @ {update}"] = measure_styles(model_dir, **settings)
    finally:
        if engine is not None:
            engine.close()
    write_json(measured, json_out)
    return styles_table(measured, problems, records[0].seed)


def _styles_engine(name: EngineName, model_dir: Path):
    """A vLLM engine on ``model_dir`` with room for the model's whole context, or None for hf."""
    if name == "hf":
        return None
    from transformers import AutoConfig

    from ggpo_offline.generate.engines import load_engine

    context = AutoConfig.from_pretrained(model_dir).max_position_embeddings
    return load_engine(name, model_dir, "auto", context, seed=0)


def _checkpoints(records: list[RunRecord]) -> list[tuple[str, int, Path]]:
    rows = []
    for record in records:
        selected = record.result.selected_update
        final = record.result.updates
        for update in sorted({u for u in (selected, final) if u}):
            rows.append((display(record.method), update, RunFolder(record.run_dir).checkpoint(update)))
    return rows


def styles_table(measured: dict[str, dict], problems: int, seed: int) -> list[Block]:
    """One row per measured checkpoint: mean@8, then each style's share of the samples and its accuracy."""
    names = sorted({name for report in measured.values() for name in report["styles"]}, key=_style_order)
    table_rows = []
    for key, report in measured.items():
        cells = []
        for name in names:
            style = report["styles"].get(name)
            if style is None:
                cells.append("0%")
                continue
            if style["accuracy"] is None:
                cells.append(number("{:.0f}% (–)", 100 * style["share"]))
            else:
                cells.append(number("{:.0f}% ({:.0f}%)", 100 * style["share"], 100 * style["accuracy"]))
        table_rows.append((key, number("{:.1f}", 100 * report["accuracy"]), *cells))
    return [
        prose(
            f"### Style shares along the arc (seed {seed}; `measure-styles --no-forced`, {problems}"
            " validation problems × 8)"
        ),
        prose(
            "Each cell: share of the samples opening with that style, then (in parentheses) how often those"
            " are right. *other*: samples that open with no style marker, which the pool never shows."
        ),
        Table(("checkpoint", "mean@8", *names), tuple(table_rows), "lr" + "r" * len(names)),
    ]


def _style_order(name: str) -> tuple[int, str]:
    return (name == "other", name)
