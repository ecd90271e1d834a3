"""`ggpo arc-report`: the offline arc (docs/arc/) from runs that several compares trained side by side — the
comparison report, the ablations beside the default settings, and the style shares along the arc."""

import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from ggpo_offline import __version__
from ggpo_offline.compare import stats
from ggpo_offline.compare.ceilings import read_ceilings
from ggpo_offline.compare.comparison import MARKER
from ggpo_offline.compare.config import ArcConfig
from ggpo_offline.compare.counts import Counts
from ggpo_offline.compare.report import STATISTICS, Report, write_report
from ggpo_offline.compare.runs import RunRecord, check_data_plans, load_run, validation_counts
from ggpo_offline.compare.tables import display, interval_verdict, rate_text
from ggpo_offline.core import markdown
from ggpo_offline.core.errors import UserError
from ggpo_offline.pool.info import PoolInfo
from ggpo_offline.pool.inspect import pool_summary
from ggpo_offline.train.run import RunFolder

ABLATIONS_FILE = "ablations.md"
ABLATIONS_COUNTS = "ablations.json"
ABLATIONS_FORMAT = "ggpo-offline ablations 1"
STYLES_FILE = "styles.md"


def arc_report(config: ArcConfig) -> Path:
    """Write the arc's report into ``config.out``: tables (`write_report`), ceilings.md (with ``--ceilings``),
    ablations.md and styles.md."""
    if config.styles_seed not in config.seeds:  # else no run to measure, and styles_along has no records
        raise UserError(
            f"--styles-seed {config.styles_seed} is not one of --seeds {','.join(map(str, config.seeds))}"
        )
    ceilings = read_ceilings(config.ceilings)  # a bad file is refused before the slow style measures
    records = _records(config.parts, config.methods, config.seeds)
    check_data_plans(records)
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    report = write_report(records, list(config.methods), list(config.seeds), out, ceilings)
    if config.ablations is not None:
        runs = ablation_runs(_ablation_parts(config.ablations))
        (out / ABLATIONS_COUNTS).write_text(json.dumps(runs, indent=1) + "\n")
        ablations = ablation_table(report.counts, runs)
        (out / ABLATIONS_FILE).write_text(ablations)
    else:  # the folder keeps an earlier arc-report's ablations, and its README shows them
        earlier = out / ABLATIONS_FILE
        ablations = earlier.read_text() if earlier.is_file() else None
    by_run = {(r.method, r.seed): r for r in records}
    chosen = [by_run[(m, config.styles_seed)] for m in config.methods if (m, config.styles_seed) in by_run]
    styles = styles_along(chosen, config.styles_problems, out / "styles.json")
    (out / STYLES_FILE).write_text(styles)
    write_readme(config, records, report, ablations, styles)
    return out


def write_readme(
    config: ArcConfig, records: list[RunRecord], report: Report, ablations: str | None, styles: str
) -> None:
    """The arc's README: what ran, the tables (``report``), the ablations, the style shares and how to
    recompute them."""
    out = config.out
    info = PoolInfo.from_metadata(pool_summary(Path(records[0].config["pool"])).get("metadata", {}))
    settings = records[0].config
    refresh = [r.config["ref_refresh"] for r in records if r.config.get("ref_refresh") is not None]
    rates = {display(r.method): rate_text(r.config["lr"]) for r in records}
    one_rate = len(set(rates.values())) == 1
    lr = rates.popitem()[1] if one_rate else "per learner " + ", ".join(f"{m} {v}" for m, v in rates.items())
    sections = [
        "# The offline arc on the embedded model (`make arc`)",
        "",
        f"Written by ggpo-offline {__version__} on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by"
        f" `ggpo arc-report` from the runs of {', '.join(f'`{p}`' for p in config.parts)}.",
        f"Methods: {', '.join(display(m) for m in config.methods)};"
        f" seeds {', '.join(map(str, config.seeds))};"
        f" pool `{settings['pool']}` ({info.model.name}, `{info.dataset_spec}`, m = {info.sampling.m});"
        f" U = {settings['updates']} updates of G = {settings['groups_per_batch']} groups, lr {lr},"
        f" β {settings['beta']}, T_ref {refresh[0] if refresh else 'never'} (learners"
        " that refresh π_ref), validation"
        f" evaluation every {settings['eval_every']} updates ({settings['eval_num_problems']} problems ×"
        f" {settings['eval_n']}), test once per run at the end ({settings['test_num_problems']} problems).",
        "Within a seed every method replays the same minibatches in the same order.",
        "",
        "## Statistics",
        "",
        STATISTICS,
        "",
        "## Results",
        "",
        report.tables,
        "![validation accuracy, log ratio, ESS, gradient norm and entropy](figure.png)",
        "",
    ]
    for title, text in (
        ("Against the ceilings of selection", report.ceilings),
        ("Ablations", ablations),
        ("What the learners select", styles),
    ):
        if text:
            sections += [f"## {title}", "", text, ""]
    sections += [
        "## Raw data",
        "",
        "`counts.json` holds every evaluation's per-problem correct counts (validation and test, every"
        " method, seed and update); `table.md` and `table.csv` are recomputed from it alone"
        " (`tests/test_report.py` checks the committed copy), and `ablations.md` from it and"
        " `ablations.json` (the ablation runs' validation counts); `ggpo report --folder` recomputes them."
        " `diagnostics.csv` holds every run's drift, K3, ESS, entropy and gradient norm per update;"
        " `styles.json` the full measure-styles reports.",
        "",
    ]
    (out / "README.md").write_text("\n".join(sections))


def part_records(part: Path) -> list[RunRecord]:
    """The finished runs a compare report folder lists in its marker."""
    marker = part / MARKER
    if not marker.is_file():
        raise UserError(f"{part}: no {MARKER}; give folders written by ggpo compare")
    records = []
    for name, run in json.loads(marker.read_text())["runs"].items():
        if not RunFolder(Path(run["folder"])).is_finished():  # a compare stopped early lists it all the same
            continue
        method, _, seed = name.rpartition("-s")
        records.append(load_run(Path(run["folder"]), method, int(seed)))
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
    missing = [f"{m}-s{s}" for s in seeds for m in methods if (m, s) not in found]
    if missing:
        raise UserError(f"the parts hold no finished run {', '.join(missing)}")
    return [found[(m, s)] for s in seeds for m in methods]


def _ablation_parts(folder: Path) -> dict[str, list[RunRecord]]:
    """Each ablation's runs by its folder name (e.g. beta-0.003)."""
    return {p.name: part_records(p) for p in sorted(folder.iterdir()) if (p / MARKER).is_file()}


def evaluation_counts(counts: Counts, method: str, seed: int) -> dict[int, dict[str, int]]:
    """One default run's validation evaluations from counts.json: update -> prompt id -> correct."""
    prompts = counts.prompts["validation"]
    found = {}
    for (m, s, split, update), by_benchmark in counts.correct.items():
        if (m, s, split) == (method, seed, "validation"):
            pairs = (zip(ids, by_benchmark[name], strict=True) for name, ids in prompts.items())
            found[update] = {p: c for pair in pairs for p, c in pair}
    return dict(sorted(found.items()))


def ablation_runs(ablations: dict[str, list[RunRecord]]) -> dict:
    """ablations.json: every ablation run's per-problem validation counts (the ablation table is recomputed
    from it and the default runs' counts.json)."""
    runs = [
        {
            "setting": name,
            "method": record.method,
            "seed": record.seed,
            "n": record.evals[0].n,
            "evaluations": {str(u): merged for u, merged in validation_counts(record).items()},
        }
        for name, records in ablations.items()
        for record in records
    ]
    return {"format": ABLATIONS_FORMAT, "runs": runs}


def _points(evaluation: dict[str, int], n: int) -> np.ndarray:
    """Per-problem mean@n in points, ``[1, problems]`` in prompt-id order."""
    return 100.0 * np.array([[evaluation[p] for p in sorted(evaluation)]], dtype=float) / n


def _peak(evaluations: dict[int, dict[str, int]]) -> int:
    """The run's checkpoint chosen on validation: the most correct samples, the earliest among equals (the
    rule of train.evaluation.selected_update, on exact integers)."""
    return max(sorted(evaluations), key=lambda update: (sum(evaluations[update].values()), -update))


def ablation_table(counts: Counts, ablations: dict) -> str:
    """The paper's Table 6 axes on validation: each setting's peak and final beside the default run of the
    same method and seed (from ``counts``), with paired intervals over problems: one seed, so each verdict
    is "too few seeds"."""
    n = counts.n["validation"]
    shown, table_rows = [], []
    for run in ablations["runs"]:
        if run["method"] not in counts.methods or run["seed"] not in counts.seeds:
            continue
        default = evaluation_counts(counts, run["method"], run["seed"])
        shown.append((run["method"], run["seed"], default))
        evaluations = {int(u): e for u, e in run["evaluations"].items()}
        final, peak = max(evaluations), _peak(evaluations)
        final_gap = stats.paired_interval(_points(evaluations[final], n) - _points(default[max(default)], n))
        peak_gap = stats.paired_interval(_points(evaluations[peak], n) - _points(default[_peak(default)], n))
        means = _points(evaluations[peak], n).mean(), _points(evaluations[final], n).mean()
        gaps = [interval_verdict(final_gap), interval_verdict(peak_gap)]
        cells = [f"{means[0]:.2f} ({peak})", f"{means[1]:.2f}", *gaps]
        table_rows.append([run["setting"], display(run["method"]), run["seed"], *cells])
    header = ["setting", "method", "seed", "peak (update)", "final", "final − default final [95 %]"]
    lines = [
        "### Ablations on validation (mean@n %, one seed): peak and final beside the default settings",
        "",
        *markdown.table([*header, "peak − default peak [95 %]"], table_rows, "llrrrrr"),
        "",
        _defaults_line(shown, n),
        "",
    ]
    return "\n".join(lines)


def _defaults_line(shown: list[tuple[str, int, dict]], n: int) -> str:
    parts = []
    for method, seed, default in dict(((m, s), (m, s, d)) for m, s, d in shown).values():
        peak, final = _peak(default), max(default)
        parts.append(
            f"{display(method)} seed {seed}: peak {_points(default[peak], n).mean():.2f} at {peak}, final "
            f"{_points(default[final], n).mean():.2f}"
        )
    return (
        "Default settings (the arc preset): " + "; ".join(parts) + ". One seed per setting: each interval is"
        " over problems and describes the two runs; a verdict about the settings needs more seeds."
    )


def styles_along(records: list[RunRecord], problems: int, json_out: Path) -> str:
    """`measure-styles --no-forced` on validation at update 0, each run's selected checkpoint and its final
    one: which behaviours a learner moves to, including output no style of the pool opens with ("other")."""
    from ggpo_offline.organism.measure import measure_styles

    measured: dict[str, dict] = {}
    initial = Path(records[0].evals[0].settings["model"]["path"])  # what update 0 evaluated
    rows = [("base model", 0, initial), *_checkpoints(records)]
    for label, update, model_dir in rows:
        key = f"{label} @ {update}"
        measured[key] = measure_styles(model_dir, n_problems=problems, forced=False, split="validation")
    json_out.write_text(json.dumps(measured, indent=2) + "\n")
    return styles_table(measured, problems, records[0].seed)


def _checkpoints(records: list[RunRecord]) -> list[tuple[str, int, Path]]:
    rows = []
    for record in records:
        selected = record.result.selected_update
        final = record.result.updates
        for update in sorted({u for u in (selected, final) if u}):
            rows.append((display(record.method), update, RunFolder(record.run_dir).checkpoint(update)))
    return rows


def styles_table(measured: dict[str, dict], problems: int, seed: int) -> str:
    """One row per measured checkpoint: mean@8, then each style's share of the samples and its accuracy."""
    names = sorted({name for report in measured.values() for name in report["styles"]}, key=_style_order)
    lines = [
        f"### Style shares along the arc (seed {seed}; `measure-styles --no-forced`, {problems} validation"
        " problems × 8)",
        "",
        "Each cell: share of the samples opening with that style, then (in parentheses) how often those are"
        " right. *other*: samples that open with no style marker, which the pool never shows.",
        "",
    ]
    table_rows = []
    for key, report in measured.items():
        cells = []
        for name in names:
            style = report["styles"].get(name)
            if style is None:
                cells.append("0%")
                continue
            right = "–" if style["accuracy"] is None else f"{100 * style['accuracy']:.0f}%"
            cells.append(f"{100 * style['share']:.0f}% ({right})")
        table_rows.append([key, f"{100 * report['accuracy']:.1f}", *cells])
    lines += markdown.table(["checkpoint", "mean@8", *names], table_rows, "lr" + "r" * len(names))
    return "\n".join(lines + [""])


def _style_order(name: str) -> tuple[int, str]:
    return (name == "other", name)
