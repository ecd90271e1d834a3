"""Where the variance of a report's differences comes from, and what more seeds, problems or samples buy."""

import statistics

from ggpo_offline.compare import stats
from ggpo_offline.compare.blocks import Block, Table, number, prose
from ggpo_offline.compare.score_tables import end_places
from ggpo_offline.compare.scores import Scores

COLUMNS = (
    "at", "seeds (runs)", "problems", "run × problem", "sampling", "± now", "± 2× seeds", "± 2× problems",
    "± 2× samples",
)  # fmt: skip


def variance_section(scores: Scores, methods: list[str]) -> tuple[list[Block], list[dict]]:
    """Per end place, over every pair of methods: each variance component's mean share of var(A − B) —
    training runs (seeds), problems, run × problem interaction, sampling — then the median 95 % half-width
    now and with twice the seeds, problems or samples. Empty with one method."""
    if len(methods) < 2:
        return [], []
    seeds = len(scores.counts.seeds)
    blocks = [
        prose("### Where the variance of a difference comes from"),
        prose(
            "Each A − B (every pair of methods) splits into a training-run part (a run better or worse on"
            " every problem: σ²_seed / S), a problem part (σ²_problem / P), the run × problem interaction and"
            " the binomial sampling of n samples (each / (S·P)); the shares are their means over the pairs."
            " ±: the median over the pairs of the 95 % interval's half-width (t on seeds − 1 df times the"
            " standard error from the same components), now and with twice the seeds, problems or samples per"
            " problem."
        ),
    ]
    gains, table_rows = {}, []
    for at, label in end_places(scores):
        found = [judged.interval for judged in scores.pairs(methods, at).values()]
        problems = found[0].problems
        shares = [_shares(i.parts, seeds, problems) for i in found]
        mean_share = [statistics.fmean(share[k] for share in shares) for k in range(4)]
        errors = {
            "now": _median_half_width(found, seeds, problems),
            "seeds": _median_half_width(found, 2 * seeds, problems) if seeds >= stats.MIN_SEEDS else None,
            "problems": _median_half_width(found, seeds, 2 * problems),
            "samples": _median_half_width(found, seeds, problems, samples_scale=2.0),
        }
        gains[label] = errors
        cells = ["–" if seeds < stats.MIN_SEEDS else number("{:.0f} %", 100 * mean_share[0])]
        cells += [number("{:.0f} %", 100 * share) for share in mean_share[1:]]
        cells += ["–" if e is None else number("{:.2f}", e) for e in errors.values()]
        table_rows.append((label, *cells))
    remedy = _remedy(gains, seeds)
    blocks += [Table(COLUMNS, tuple(table_rows), "l" + "r" * 8), *([prose(remedy)] if remedy else [])]
    return blocks, []


def _shares(parts: stats.Components, seeds: int, problems: int) -> tuple[float, float, float, float]:
    seed = 0.0 if seeds < stats.MIN_SEEDS else parts.seed / seeds
    sampling = (parts.sampling or 0.0) / (seeds * problems)
    interaction = parts.residual / (seeds * problems) - sampling
    total = seed + parts.problem / problems + interaction + sampling
    if total == 0:
        return (0.0, 0.0, 0.0, 0.0)
    return (seed / total, parts.problem / problems / total, interaction / total, sampling / total)


def _median_half_width(
    found: list[stats.Interval], seeds: int, problems: int, samples_scale: float = 1.0
) -> float:
    quantile = stats.t_quantile(seeds - 1 if seeds >= stats.MIN_SEEDS else problems - 1)
    errors = (i.parts.variance(seeds, problems, samples_scale) ** 0.5 for i in found)
    return quantile * statistics.median(errors)


def _remedy(gains: dict[str, dict], seeds: int) -> str:
    """In words: how much twice the seeds, problems or samples would narrow the median interval."""
    if seeds < stats.MIN_SEEDS:
        return (
            "One seed: the training runs' part cannot be seen, so these errors describe the runs compared,"
            " not the learners; at least two seeds are needed for a verdict."
        )
    parts = []
    for label, errors in gains.items():
        if errors["now"] == 0:
            continue
        narrower = {k: 100 * (1 - errors[k] / errors["now"]) for k in ("seeds", "problems", "samples")}
        best = max(narrower, key=narrower.get)
        parts.append(
            f"at {label}, twice the {best} would narrow the median interval most ("
            + ", ".join(f"{k} {v:.0f} %" for k, v in narrower.items())
            + ")"
        )
    return "What more data would buy: " + "; ".join(parts) + "." if parts else ""
