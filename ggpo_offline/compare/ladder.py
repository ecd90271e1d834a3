"""`ggpo ladder-report`: the staleness ladder (docs/ladder/) — compares trained with --sync-every N beside
the offline compare of the same pool, seeds and evaluation (its N = U): each method at each N against its
offline self, the paper's two claims at each N, the fall after the peak, and the rounds' mismatch; read from
the compares' committed files alone (counts.json and diagnostics.csv), not their runs."""

import itertools
from pathlib import Path

import numpy as np
import polars as pl

from ggpo_offline.compare import stats
from ggpo_offline.compare.config import LadderConfig
from ggpo_offline.compare.counts import COUNTS_FILE, SELECTED, Counts
from ggpo_offline.compare.report import DIAGNOSTICS_FILE, SYNC_EVERY
from ggpo_offline.compare.tables import display
from ggpo_offline.core import markdown
from ggpo_offline.core.errors import UserError, replace_text, write_json
from ggpo_offline.train.metric_names import MISMATCH_K3, ROUND_INDEX, ROUND_METRICS, UPDATE

README = "README.md"
LADDER_FILE = "ladder.json"
CLAIMED = "ggpo"
"""The learner whose two claims the ladder tests (paper: above GRPO/AGRO at small N, flat as N grows)."""


class Rung:
    """One compare of the ladder: its N (None offline), its counts and, for a synchronised one, its runs'
    diagnostics per update (diagnostics.csv: the counted runs' rows)."""

    def __init__(self, folder: Path, synchronised: bool):
        self.folder = Path(folder)
        self.counts = Counts.read(self._file(COUNTS_FILE))
        self.diagnostics, self.sync_every = None, None
        if synchronised:
            rows = pl.read_csv(self._file(DIAGNOSTICS_FILE), infer_schema_length=None)
            methods, seeds = list(self.counts.methods), list(self.counts.seeds)
            self.diagnostics = rows.filter(pl.col("method").is_in(methods) & pl.col("seed").is_in(seeds))
            self.sync_every = self._sync_every()

    def _file(self, name: str) -> Path:
        if not (self.folder / name).is_file():
            raise UserError(f"{self.folder} has no {name}: give the folder of a finished ggpo compare")
        return self.folder / name

    def _sync_every(self) -> int:
        """The N the rung's runs were trained with (every run of a compare shares it)."""
        if SYNC_EVERY not in self.diagnostics.columns:
            raise UserError(
                f"{self.folder}: its {DIAGNOSTICS_FILE} has no {SYNC_EVERY} column: give a compare trained "
                "with --sync-every N (one whose report predates the column is rewritten by running its ggpo "
                "compare again, which reuses its finished runs)"
            )
        found = self.diagnostics[SYNC_EVERY].unique().to_list()
        if len(found) != 1 or None in found:
            raise UserError(
                f"{self.folder}: its runs were not all trained with one --sync-every (found "
                f"{sorted(map(str, found))})"
            )
        return int(found[0])

    @property
    def name(self) -> str:
        return "offline" if self.sync_every is None else f"N = {self.sync_every}"


def ladder_report(config: LadderConfig) -> Path:
    """Write the ladder's README.md and ladder.json (every number in it) into ``config.out``."""
    offline = Rung(config.offline, synchronised=False)
    rungs = [Rung(folder, synchronised=True) for folder in config.rungs]
    seeds = [s for s in rungs[0].counts.seeds if all(s in r.counts.seeds for r in [offline, *rungs])]
    if not seeds:
        raise UserError("the offline compare and the rungs share no seed")
    data = {
        "seeds": seeds,
        "rungs": [r.name for r in rungs],
        "against_offline": _against_offline(offline, rungs, seeds),
        "claim_above": _claim_above([offline, *rungs], seeds),
        "steps": _steps(rungs, offline, seeds),
        "falls": _falls([offline, *rungs], seeds),
        "rounds": {r.name: _round_means(r) for r in rungs},
    }
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(data, out / LADDER_FILE)
    replace_text(out / README, _readme(config, offline, rungs, data))
    return out


def seed_matrix(
    counts: Counts, method: str, split: str, checkpoint: int | str, seeds: list[int]
) -> np.ndarray:
    """Correct counts [seeds, problems] of ``method`` on ``split`` for ``seeds`` (in that order)."""
    full = counts.matrix(method, split, counts.scopes(split)[-1], checkpoint)
    return full[[counts.seeds.index(seed) for seed in seeds]]


def _methods(*rungs: Rung) -> list[str]:
    """The methods every given rung trained, in the first one's order."""
    return [m for m in rungs[0].counts.methods if all(m in r.counts.methods for r in rungs)]


def points(matrix: np.ndarray, n: int) -> float:
    """Mean@n in points of a counts matrix."""
    return float(matrix.mean() * 100.0 / n)


def _against_offline(offline: Rung, rungs: list[Rung], seeds: list[int]) -> dict:
    """Per rung, each method's test mean@n at the selected checkpoint and its difference from the offline
    run of the same seed (paired by seed and problem); each rung's methods are one Holm family."""
    n = offline.counts.n["test"]
    found = {}
    for rung in rungs:
        methods = _methods(rung, offline)
        pairs = [
            (
                seed_matrix(rung.counts, m, "test", SELECTED, seeds),
                seed_matrix(offline.counts, m, "test", SELECTED, seeds),
            )
            for m in methods
        ]
        judged = stats.judge([stats.difference(a, b, n) for a, b in pairs])
        found[rung.name] = {
            m: {"rung": points(a, n), "offline": points(b, n), "difference": j.text()}
            for m, (a, b), j in zip(methods, pairs, judged, strict=True)
        }
    return found


def _claim_above(rungs: list[Rung], seeds: list[int]) -> dict:
    """At each N, GGPO − each other method on test at the selected checkpoints; each N is one family."""
    found = {}
    for rung in rungs:
        counts, n = rung.counts, rung.counts.n["test"]
        if CLAIMED not in counts.methods:
            continue
        others = [m for m in counts.methods if m != CLAIMED]
        claimed = seed_matrix(counts, CLAIMED, "test", SELECTED, seeds)
        intervals = [
            stats.difference(claimed, seed_matrix(counts, m, "test", SELECTED, seeds), n) for m in others
        ]
        found[rung.name] = {m: j.text() for m, j in zip(others, stats.judge(intervals), strict=True)}
    return found


def _steps(rungs: list[Rung], offline: Rung, seeds: list[int]) -> dict:
    """Each method from one N to the next larger (offline last: N = U) on test at the selected checkpoint,
    larger − smaller, paired by seed and problem: is it flat as N grows (the paper's second claim)? Each
    step's methods are one family."""
    ladder = [*sorted(rungs, key=lambda rung: rung.sync_every), offline]
    n = offline.counts.n["test"]
    found = {}
    for smaller, larger in itertools.pairwise(ladder):
        methods = _methods(smaller, larger)
        intervals = [
            stats.difference(
                seed_matrix(larger.counts, m, "test", SELECTED, seeds),
                seed_matrix(smaller.counts, m, "test", SELECTED, seeds),
                n,
            )
            for m in methods
        ]
        judged = stats.judge(intervals)
        found[f"{smaller.name} → {larger.name}"] = {m: j.text() for m, j in zip(methods, judged, strict=True)}
    return found


def _falls(rungs: list[Rung], seeds: list[int]) -> dict:
    """Validation peak (the selected checkpoint) and final mean@n, and the fall peak − final paired within
    each run: does the method still collapse at this N? Each N's methods are one family."""
    found = {}
    for rung in rungs:
        counts, n = rung.counts, rung.counts.n["validation"]
        final = counts.final("validation")
        peaks = [seed_matrix(counts, m, "validation", SELECTED, seeds) for m in counts.methods]
        finals = [seed_matrix(counts, m, "validation", final, seeds) for m in counts.methods]
        judged = stats.judge([stats.difference(p, f, n) for p, f in zip(peaks, finals, strict=True)])
        found[rung.name] = {
            m: {"peak": points(p, n), "final": points(f, n), "fall": j.text()}
            for m, p, f, j in zip(counts.methods, peaks, finals, judged, strict=True)
        }
    return found


def _round_means(rung: Rung) -> dict:
    """Per method, the rounds' diagnostics (metric_names "round/") averaged over every round of every
    seed, and the per-update mismatch K3 by the update's place in its round (how stale its samples are)."""
    rows = rung.diagnostics
    measured = [name for name in ROUND_METRICS if name in rows.columns]
    rounds = rows.filter(pl.col(ROUND_INDEX).is_not_null()) if ROUND_INDEX in rows.columns else rows.clear()
    aged = rows.filter(pl.col(MISMATCH_K3).is_not_null()).select(
        "method", pl.col(MISMATCH_K3).cast(pl.Float64), age=pl.col(UPDATE) % rung.sync_every
    )
    found = {}
    for method in rung.counts.methods:
        own = rounds.filter(pl.col("method") == method)
        means = {name: own[name].cast(pl.Float64).mean() for name in measured}
        by_age = aged.filter(pl.col("method") == method).group_by("age").agg(pl.col(MISMATCH_K3).mean())
        means |= {f"{MISMATCH_K3}@{age}": k3 for age, k3 in by_age.sort("age").iter_rows()}
        found[method] = {name: value for name, value in means.items() if value is not None}
    return {method: means for method, means in found.items() if means}


def _readme(config: LadderConfig, offline: Rung, rungs: list[Rung], data: dict) -> str:
    seeds = ", ".join(map(str, data["seeds"]))
    intro = [
        "# The staleness ladder",
        "",
        f"Offline compare: `{config.offline}` (every update replays the pool π0 sampled: N = U). Rungs: "
        + ", ".join(f"`{r.folder}` ({r.name})" for r in rungs)
        + f". Seeds {seeds}, paired by seed and problem; intervals are t on seeds − 1 df with Holm per "
        "family (`compare/stats.py`). With --sync-every N the policy samples a new round of N × G "
        "mixed-reward groups every N updates from the pool's next prompts (Algorithm 1); round 0 is the "
        "pool.",
        "",
    ]
    sections = [
        _against_offline_table(offline, rungs, data),
        _claims_table(offline, data),
        _steps_table(offline, data),
        _falls_table(offline, data),
        _rounds_table(data),
    ]
    return "\n".join(intro + [line for section in sections for line in section])


def _against_offline_table(offline: Rung, rungs: list[Rung], data: dict) -> list[str]:
    """A row per offline method some rung trained ("—" where a rung did not)."""
    header = ["method", "offline"] + [f"{r} (− offline [95 %])" for r in data["rungs"]]
    rows = []
    for method in [m for m in offline.counts.methods if any(m in r.counts.methods for r in rungs)]:
        cells = [data["against_offline"][rung].get(method) for rung in data["rungs"]]
        offline_mean = next(cell["offline"] for cell in cells if cell is not None)
        row = [display(method), f"{offline_mean:.2f}"]
        row += ["—" if cell is None else f"{cell['rung']:.2f} ({cell['difference']})" for cell in cells]
        rows.append(row)
    return [
        "## Each method at each N beside its offline self (test, selected checkpoint)",
        "",
        *markdown.table(header, rows, "l" + "r" * (len(header) - 1)),
        "",
    ]


def _claims_table(offline: Rung, data: dict) -> list[str]:
    claims = data["claim_above"]
    others = sorted({m for by in claims.values() for m in by}, key=lambda m: offline.counts.methods.index(m))
    names = [offline.name, *data["rungs"]]
    rows = [[name] + [claims.get(name, {}).get(m, "—") for m in others] for name in names if name in claims]
    header = ["N"] + [f"GGPO − {display(m)}" for m in others]
    return [
        "## GGPO above the others at each N (test, selected checkpoint; each N one family)",
        "",
        *markdown.table(header, rows, "l" + "r" * len(others)),
        "",
    ]


def _steps_table(offline: Rung, data: dict) -> list[str]:
    steps = data["steps"]
    methods = [m for m in offline.counts.methods if any(m in by for by in steps.values())]
    rows = [[step] + [by.get(m, "—") for m in methods] for step, by in steps.items()]
    return [
        "## Each method as N grows (test, selected checkpoint: larger N − smaller; each step one family)",
        "",
        *markdown.table(["N", *map(display, methods)], rows, "l" + "r" * len(methods)),
        "",
    ]


def _falls_table(offline: Rung, data: dict) -> list[str]:
    rows = [
        [name, display(m), f"{v['peak']:.2f}", f"{v['final']:.2f}", v["fall"]]
        for name in [offline.name, *data["rungs"]]
        for m, v in data["falls"][name].items()
    ]
    return [
        "## The fall after the peak (validation: selected − final, paired within each run)",
        "",
        *markdown.table(["N", "method", "peak", "final", "peak − final [95 %]"], rows, "llrrr"),
        "",
    ]


def _rounds_table(data: dict) -> list[str]:
    found = {k for by in data["rounds"].values() for v in by.values() for k in v}
    ages = sorted((k for k in found if k.startswith(MISMATCH_K3 + "@")), key=lambda k: int(k.split("@")[1]))
    header = ["N", "method", *ROUND_METRICS, *ages]
    rows = [
        [name, display(m), *("—" if k not in v else f"{v[k]:.4g}" for k in [*ROUND_METRICS, *ages])]
        for name, by in data["rounds"].items()
        for m, v in by.items()
    ]
    return [
        "## The rounds' mismatch (every round of every seed, on the policy that sampled it)",
        "",
        *markdown.table(header, rows, "ll" + "r" * (len(header) - 2)),
        "",
        f"`{MISMATCH_K3}@a`: the update's K3 between the learner and the engine's log-probs of the round it "
        "trains on, a updates after the round was sampled. Every number: `ladder.json`; each rung's own "
        "report (frontier, matched drift, figures) is its compare's README.",
        "",
    ]
