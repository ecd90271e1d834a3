"""Where each method ends against the embedded organism's two ceilings of selection, per prompt class."""

import json
import re
from pathlib import Path

import numpy as np

from ggpo_offline.compare import stats
from ggpo_offline.compare.blocks import Block, Table, number, prose
from ggpo_offline.compare.counts import BASE, SELECTED
from ggpo_offline.compare.score_tables import display
from ggpo_offline.compare.scores import At, Scores
from ggpo_offline.core.errors import UserError, one_line
from ggpo_offline.organism.ceilings import selection_ceilings
from ggpo_offline.organism.styles import prompt_class

CEILINGS_FILE = "ceilings.md"
LEVEL = re.compile(r"arith-L(\d)-")
"""An arith prompt id names its level: ``arith-L3-<hash>``."""


def _classes(prompt_ids: tuple[str, ...]) -> list[str] | None:
    """Each problem's prompt class, or None when a prompt is not an arith problem."""
    levels = [LEVEL.match(prompt_id) for prompt_id in prompt_ids]
    return None if not all(levels) else [prompt_class(int(level.group(1))) for level in levels]


def ceilings_section(scores: Scores, methods: list[str], styles_report: dict) -> list[Block]:
    """Each method's test mean@n at its selected checkpoint, per prompt class and against the
    prompt-blind ceiling (paired over seeds and problems; the ceiling itself taken as exact), and a verdict
    in words. Empty when there is no test split or its problems are not arith problems."""
    counts = scores.counts
    if "test" not in counts.splits or len(counts.prompts["test"]) != 1:
        return []
    ((scope, prompt_ids),) = counts.prompts["test"].items()
    classes = _classes(prompt_ids)
    if classes is None:
        return []
    names = sorted(set(classes))
    masks = {name: np.array([c == name for c in classes]) for name in names}
    problems = {name: int(mask.sum()) for name, mask in masks.items()}
    found = selection_ceilings(styles_report["forced_by_class"], problems)
    blind = 100 * found["prompt_blind_ceiling"]["accuracy"]
    blind_style = found["prompt_blind_ceiling"]["style"]
    aware, best = 100 * found["prompt_aware_ceiling"]["accuracy"], found["prompt_aware_ceiling"]["styles"]
    n = counts.n["test"]
    forced = styles_report["forced_by_class"]
    blocks = [
        prose(f"### Against the ceilings of selection: test at the selected checkpoint on {scope} (%)"),
        prose(
            f"The pool's model forced into one style everywhere reaches at most the **prompt-blind ceiling**,"
            f" {blind:.2f} ({blind_style} everywhere); the best style of each prompt class reaches the "
            f"**prompt-aware ceiling**, {aware:.2f} ("
            + ", ".join(f"{style} on {name}: {100 * forced[style][name]:.1f}" for name, style in best.items())
            + f"). Both are the forced accuracies per class that `ggpo measure-styles` measured "
            f"({styles_report['n_problems']} {styles_report['split']} problems × {styles_report['m']}),"
            " weighted by this benchmark's class shares; the interval treats the ceiling as exact."
        ),
    ]
    scored, intervals, ends = {}, {}, {}
    for method in [BASE] + methods:
        at = At("test", scope, 0 if method == BASE else SELECTED)
        points = scores.points(method, at)
        updates = counts.checkpoints(method, at.checkpoint)
        update = " ".join(map(str, updates)) if len(set(updates)) > 1 else str(updates[0])
        per_class = [number("{:.2f}", float(points[:, masks[name]].mean())) for name in names]
        intervals[method] = stats.paired_interval(points - blind)
        ends[method] = (float(points.mean()), {name: float(points[:, masks[name]].mean()) for name in names})
        scored[method] = [display(method), update, *per_class, number("{:.2f}", float(points.mean()))]
    judged = dict(zip(methods, stats.judge([intervals[m] for m in methods]), strict=True))
    above = [display(m) for m in methods if judged[m].resolved and judged[m].interval.mean > 0]
    verdicts = {BASE: ""} | {method: judged[method].verdict for method in methods}
    header = ("method", "update", *(f"{name} ({problems[name]})" for name in names), f"mean@{n}")
    header += ("− prompt-blind ceiling [95 % CI]", f"verdict (Holm over {len(methods)})")
    table_rows = tuple((*cells, intervals[m].number(), verdicts[m]) for m, cells in scored.items())
    blocks.append(Table(header, table_rows, "lr" + "r" * (len(names) + 2) + "l"))
    blocks.append(prose(_verdict(ends, methods, above, blind, forced, best, len(counts.seeds))))
    return blocks


def _verdict(
    ends: dict, methods: list[str], above: list[str], blind: float, forced: dict, best: dict, seeds: int
) -> str:
    """The verdict in words: which methods end resolved above the prompt-blind ceiling, or that none does and
    where the best one falls short of each class's best style."""
    few = "; one seed: too few seeds for a verdict" if seeds < stats.MIN_SEEDS else ""
    if above:
        family = f"Holm over the {len(methods)} methods"
        return f"Resolved above the prompt-blind ceiling ({family}): {', '.join(above)}."
    leader = max(methods, key=lambda method: ends[method][0])
    mean, per_class = ends[leader]
    gaps = ", ".join(
        f"{name} {per_class[name]:.1f} against {style}'s {100 * forced[style][name]:.1f}"
        for name, style in best.items()
    )
    return (
        f"No method ends resolved above the prompt-blind ceiling ({blind:.2f}{few}). The best,"
        f" {display(leader)}, ends at {mean:.2f}: {gaps}."
    )


def read_ceilings(path: Path | None) -> dict | None:
    """The ``--ceilings`` report (``measure-styles --json``, forced measurements included), or one error."""
    if path is None:
        return None
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise UserError(f"--ceilings {path}: cannot read it as JSON ({one_line(error)})") from None
    if not isinstance(report, dict) or not report.get("forced_by_class"):
        raise UserError(
            f"--ceilings {path}: not a `ggpo measure-styles --json` report with forced measurements"
        )
    return report
