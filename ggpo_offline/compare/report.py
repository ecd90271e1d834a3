"""Tables and figures of a comparison: finished runs in, table.md / table.csv / PNG figures out."""

import csv
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ggpo_offline.core.errors import UserError
from ggpo_offline.train.learners import learner
from ggpo_offline.train.run import RunFolder

SUITE = "suite"
FIGURES = ("figure.png", "accuracy.png", "log_ratio.png", "ess.png", "grad_norm.png", "entropy.png")


@dataclass(frozen=True)
class RunRecord:
    """A finished run as the report reads it: settings, fingerprints, evaluations and metric records."""

    method: str
    seed: int
    run_dir: Path
    config: dict
    result: dict
    evals: dict[int, dict]
    """Evaluation report per update."""
    metrics: list[dict]


@dataclass(frozen=True)
class Cell:
    """One table entry: the mean and sample standard deviation of a score over seeds (percent)."""

    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float:
        """Sample std (ddof = 1) as the paper reports it; NaN with a single seed."""
        return statistics.stdev(self.values) if len(self.values) > 1 else math.nan

    def text(self) -> str:
        return f"{self.mean:.2f}" if math.isnan(self.std) else f"{self.mean:.2f} ± {self.std:.2f}"


def load_run(run_dir: Path, method: str, seed: int) -> RunRecord:
    """Read a finished run folder written by ``ggpo train`` (config.json, result.json, eval/, metrics)."""
    folder = RunFolder(run_dir)
    return RunRecord(
        method=method,
        seed=seed,
        run_dir=run_dir,
        config=folder.read_config(),
        result=folder.read_result(),
        evals=folder.read_evals(),
        metrics=folder.read_metrics(),
    )


def check_data_plans(records: list[RunRecord]) -> dict[int, str]:
    """The data-order fingerprint of each seed; UserError when runs of a seed (or the pool) disagree."""
    pools = {r.result["pool_fingerprint"] for r in records}
    if len(pools) > 1:
        raise UserError(f"the runs were trained on {len(pools)} different pools; refusing to report")
    plans: dict[int, str] = {}
    for record in records:
        fingerprint = record.result["data_order_fingerprint"]
        first = plans.setdefault(record.seed, fingerprint)
        if fingerprint != first:
            others = [r for r in records if r.seed == record.seed]
            listing = ", ".join(f"{r.run_dir.name} {r.result['data_order_fingerprint'][:12]}" for r in others)
            raise UserError(
                f"seed {record.seed}: the runs do not share one data plan ({listing}); refusing to report"
            )
    return plans


# -- tables ------------------------------------------------------------------------------------------


def eval_scopes(records: list[RunRecord]) -> list[str]:
    """The benchmarks evaluated, then the suite when there are several."""
    any_report = next(iter(records[0].evals.values()))
    names = list(any_report["benchmarks"])
    return names + [SUITE] if len(names) > 1 else names


def _score(report: dict, scope: str, key: str) -> float:
    scores = report[SUITE] if scope == SUITE else report["benchmarks"][scope]
    return 100.0 * scores[key]


def accuracy_table(records: list[RunRecord], methods: list[str], scope: str) -> dict[int, dict[str, Cell]]:
    """mean@n per evaluated update and method over seeds: the shape of the paper's Table 5."""
    updates = sorted({u for r in records for u in r.evals})
    table: dict[int, dict[str, Cell]] = {}
    for update in updates:
        row = {}
        for method in methods:
            values = [_score(r.evals[update], scope, "mean@n") for r in records if r.method == method]
            if values:
                row[method] = Cell(tuple(values))
        table[update] = row
    return table


def pass_at_k_table(records: list[RunRecord], methods: list[str], scope: str) -> dict[str, dict[str, Cell]]:
    """mean@n and pass@k at the final update per method (and the initial model as "base"): Table 3's shape,
    plus each run's gain in mean@n over its own update 0 (its seed's base model)."""
    final = max(records[0].evals)
    ks = records[0].evals[final]["ks"]
    keys = ["mean@n"] + [f"pass@{k}" for k in ks]
    rows = {"base": [r for r in records if r.method == methods[0]]}
    rows |= {method: [r for r in records if r.method == method] for method in methods}
    table = {}
    for name, runs in rows.items():
        update = 0 if name == "base" else final
        table[name] = {key: Cell(tuple(_score(r.evals[update], scope, key) for r in runs)) for key in keys}
        gains = (_score(r.evals[update], scope, "mean@n") - _score(r.evals[0], scope, "mean@n") for r in runs)
        table[name]["gain"] = Cell(tuple(gains))
    return table


def paper_findings(records: list[RunRecord], methods: list[str], scope: str) -> list[str]:
    """Whether the paper's qualitative offline findings (SPEC.md "Reference points from the paper") hold in
    these runs, as measured: GGPO >= AGRO at the final update, GRPO+TIS >= GRPO at mid-training, and which
    method leads at the end (the paper: GGPO). A finding whose methods were not run is left out."""
    table = accuracy_table(records, methods, scope)
    final = max(table)
    middle = min(table, key=lambda update: (abs(update - final / 2), update))
    lines = []

    def compare_at(update: int, better: str, worse: str, claim: str) -> None:
        if better not in table[update] or worse not in table[update]:
            return
        high, low = table[update][better], table[update][worse]
        verdict = "holds" if high.mean >= low.mean else "does not hold"
        spread = max(0.0 if math.isnan(c.std) else c.std for c in (high, low))
        noise = " (the difference is within one seed std)" if abs(high.mean - low.mean) <= spread else ""
        lines.append(
            f"- {claim} at update {update}: **{verdict}** here — {_display(better)} {high.text()} vs"
            f" {_display(worse)} {low.text()}{noise}."
        )

    compare_at(final, "ggpo", "agro", "GGPO ≥ AGRO (paper: at every evaluation)")
    compare_at(
        middle, "grpo-tis", "grpo", "GRPO+TIS ≥ GRPO at mid-training (paper: 57.9 vs 38.4 at update 160)"
    )
    leader = max(table[final], key=lambda method: table[final][method].mean)
    paper = "as in the paper" if leader == "ggpo" else "the paper's leader is GGPO"
    lines.append(
        f"- Leader at update {final}: **{_display(leader)}** ({table[final][leader].text()}; {paper})."
    )
    return lines


def _display(method: str) -> str:
    return "base model" if method == "base" else learner(method).label


def write_tables(records: list[RunRecord], methods: list[str], seeds: list[int], out: Path) -> str:
    """Write table.md and table.csv into ``out``; returns the markdown."""
    n = records[0].config["eval_n"]
    final = max(records[0].evals)
    seed_text = ", ".join(str(s) for s in seeds)
    markdown, rows = [], []
    for scope in eval_scopes(records):
        what = "problem-weighted suite" if scope == SUITE else scope
        markdown += [
            f"### Eval accuracy: mean@{n} (%) on {what}, mean ± sample std over seeds {seed_text}",
            "",
            "| update | " + " | ".join(_display(m) for m in methods) + " |",
            "|---:|" + "---:|" * len(methods),
        ]
        for update, row in accuracy_table(records, methods, scope).items():
            markdown.append(f"| {update} | " + " | ".join(row[m].text() for m in methods) + " |")
            rows += [_csv_row("accuracy", scope, m, update, f"mean@{n}", row[m]) for m in methods]
        markdown.append("")
        table = pass_at_k_table(records, methods, scope)
        keys = list(next(iter(table.values())))
        headers = [{"mean@n": f"mean@{n}", "gain": f"gain in mean@{n}"}.get(key, key) for key in keys]
        markdown += [
            f"### Final pass@k (%) on {what} at update {final} (base model: update 0; gain: points of"
            f" mean@{n} over the base model)",
            "",
            "| method | " + " | ".join(headers) + " |",
            "|---|" + "---:|" * len(keys),
        ]
        for name, cells in table.items():
            markdown.append(f"| {_display(name)} | " + " | ".join(cells[key].text() for key in keys) + " |")
            update = 0 if name == "base" else final
            rows += [
                _csv_row("pass_at_k", scope, name, update, header, cells[key])
                for key, header in zip(keys, headers, strict=True)
            ]
        markdown.append("")
        markdown += [
            f"### The paper's offline findings, on {what}",
            "",
            *paper_findings(records, methods, scope),
            "",
        ]
    text = "\n".join(markdown)
    (out / "table.md").write_text(text)
    with (out / "table.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return text


def _csv_row(table: str, scope: str, method: str, update: int, metric: str, cell: Cell) -> dict:
    return {
        "table": table,
        "benchmark": scope,
        "method": method,
        "update": update,
        "metric": metric,
        "mean": round(cell.mean, 6),
        "std": "" if math.isnan(cell.std) else round(cell.std, 6),
        "seeds": len(cell.values),
        "values": " ".join(f"{v:.6g}" for v in cell.values),
    }


# -- figures -----------------------------------------------------------------------------------------


def _series(record: RunRecord, key: str) -> tuple[list[int], list[float]]:
    points = [(r["update"], r[key]) for r in record.metrics if r.get(key) is not None]
    return [u for u, _ in points], [v for _, v in points]


def _plot_accuracy(ax, records: list[RunRecord], methods: list[str], scope: str) -> None:
    n = records[0].config["eval_n"]
    for method, row in _by_method(accuracy_table(records, methods, scope)).items():
        updates = sorted(row)
        means = [row[u].mean for u in updates]
        stds = [0.0 if math.isnan(row[u].std) else row[u].std for u in updates]
        style = learner(method).style
        ax.plot(updates, means, marker="o", markersize=3, label=_display(method), **style)
        low = [m - s for m, s in zip(means, stds, strict=True)]
        high = [m + s for m, s in zip(means, stds, strict=True)]
        ax.fill_between(updates, low, high, color=style["color"], alpha=0.18, linewidth=0)
    what = "suite" if scope == SUITE else scope
    ax.set_title(f"{what} mean@{n} (%), ±1 std over seeds")
    ax.set_xlabel("optimizer updates")


def _by_method(table: dict[int, dict[str, Cell]]) -> dict[str, dict[int, Cell]]:
    by_method: dict[str, dict[int, Cell]] = {}
    for update, row in table.items():
        for method, cell in row.items():
            by_method.setdefault(method, {})[update] = cell
    return by_method


def _plot_diagnostic(ax, records: list[RunRecord], key: str, title: str, log: bool) -> None:
    for record in records:
        updates, values = _series(record, key)
        if log:
            values = [max(v, 1e-12) for v in values]  # an exact 0 cannot sit on a log axis
        marker = "o" if len(values) <= 20 else None  # sparse series (block ESS): show where the points are
        style = learner(record.method).style
        ax.plot(
            updates,
            values,
            label=_display(record.method),
            linewidth=1.2,
            marker=marker,
            markersize=3,
            **style,
        )
    if log:
        ax.set_yscale("log")
    ax.set_title(f"{title} (seed {records[0].seed})")
    ax.set_xlabel("optimizer updates")


def _panels(
    records: list[RunRecord], methods: list[str], seed: int, scope: str
) -> list[tuple[str, Callable]]:
    """(file name, draw function on an Axes) for each panel: the paper's Figure 4, then the entropy."""
    first = [r for r in records if r.seed == seed]
    first.sort(key=lambda r: methods.index(r.method))
    return [
        ("accuracy.png", lambda ax: _plot_accuracy(ax, records, methods, scope)),
        (
            "log_ratio.png",
            lambda ax: _plot_diagnostic(ax, first, "mismatch/drift", "token-mean |log π_θ/μ|", log=True),
        ),
        (
            "ess.png",
            lambda ax: _plot_diagnostic(ax, first, "mismatch/ess_block", "normalized sequence ESS", log=True),
        ),
        (
            "grad_norm.png",
            lambda ax: _plot_diagnostic(ax, first, "optim/grad_norm", "gradient norm", log=False),
        ),
        (
            "entropy.png",
            lambda ax: _plot_diagnostic(ax, first, "policy/entropy", "token entropy (nats)", log=False),
        ),
    ]


def write_figures(records: list[RunRecord], methods: list[str], seeds: list[int], out: Path) -> list[Path]:
    """figure.png (the paper's Figure 4 panels and the entropy, side by side) and one PNG per panel."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    scope = eval_scopes(records)[-1]  # the suite when there are several benchmarks
    panels = _panels(records, methods, seeds[0], scope)
    written = []
    figure, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), constrained_layout=True)
    for ax, (_, draw) in zip(axes, panels, strict=True):
        draw(ax)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncol=len(labels), frameon=False)
    figure.savefig(out / "figure.png", dpi=120)
    plt.close(figure)
    written.append(out / "figure.png")
    for name, draw in panels:
        figure, ax = plt.subplots(figsize=(5.2, 3.8), constrained_layout=True)
        draw(ax)
        ax.grid(alpha=0.3)
        ax.legend(frameon=False, fontsize="small")
        figure.savefig(out / name, dpi=120)
        plt.close(figure)
        written.append(out / name)
    return written
