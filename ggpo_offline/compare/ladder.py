"""`ggpo ladder-report`: the staleness ladder (docs/ladder/) — compares trained with --sync-every N beside
the offline compare of the same pool, seeds and evaluation (its N = U): each method at each N against its
offline self, the paper's two claims at each N, the fall after the peak, and the rounds' mismatch; read from
the compares' committed files alone (counts.json and diagnostics.csv), not their runs."""

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ggpo_offline.compare import render, stats
from ggpo_offline.compare.blocks import Section, Table, number, prose
from ggpo_offline.compare.config import LadderConfig
from ggpo_offline.compare.counts import COUNTS_FILE, SELECTED, Counts
from ggpo_offline.compare.render import ReportData
from ggpo_offline.compare.report import DIAGNOSTICS_FILE, SYNC_EVERY
from ggpo_offline.compare.score_tables import display
from ggpo_offline.compare.stats import Verdict
from ggpo_offline.core.errors import UserError, read_versioned, write_versioned
from ggpo_offline.train.metric_names import MISMATCH_K3, ROUND_INDEX, ROUND_METRICS, UPDATE

LADDER_FILE = "ladder.json"
LADDER_FORMAT = "ggpo-offline ladder 2"
OFFLINE = "offline"
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
        return OFFLINE if self.sync_every is None else f"N = {self.sync_every}"


@dataclass(frozen=True)
class BesideOffline:
    """A method's test mean@n (points) at a rung and offline, and their paired difference."""

    rung: float
    offline: float
    difference: Verdict


@dataclass(frozen=True)
class Fall:
    """A method's validation peak and final mean@n (points) at one N, and the fall peak − final."""

    peak: float
    final: float
    fall: Verdict


@dataclass(frozen=True)
class Ladder:
    """ladder.json: every number of the ladder, from which its README's tables are rendered alone."""

    seeds: list[int]
    methods: list[str]
    """The offline compare's methods, in its order."""
    rungs: list[str]
    """Each rung's name ("N = 4"), as given."""
    against_offline: dict[str, dict[str, BesideOffline]]
    """rung -> method -> the method at that N against its offline self; each rung one Holm family."""
    claim_above: dict[str, dict[str, Verdict]]
    """N -> other method -> GGPO − it; each N one family."""
    steps: dict[str, dict[str, Verdict]]
    """"N = 1 → N = 4" -> method -> larger N − smaller; each step one family."""
    falls: dict[str, dict[str, Fall]]
    """N -> method -> its fall after the peak; each N one family."""
    rounds: dict[str, dict[str, dict[str, float]]]
    """rung -> method -> the rounds' diagnostics and K3 by the update's place in its round."""

    def write(self, folder: Path) -> None:
        write_versioned(self, LADDER_FORMAT, folder / LADDER_FILE)

    @classmethod
    def read(cls, folder: Path) -> "Ladder":
        """The folder's ladder.json; UserError in one line where it has none or another format."""
        missing = f"{folder}: no {LADDER_FILE}, the numbers its report.json's tables come from"
        data = read_versioned(folder / LADDER_FILE, (LADDER_FORMAT,), missing)
        return cls(
            data["seeds"],
            data["methods"],
            data["rungs"],
            _by_method(
                data["against_offline"],
                lambda v: BesideOffline(**v | {"difference": Verdict(**v["difference"])}),
            ),
            _by_method(data["claim_above"], lambda v: Verdict(**v)),
            _by_method(data["steps"], lambda v: Verdict(**v)),
            _by_method(data["falls"], lambda v: Fall(**v | {"fall": Verdict(**v["fall"])})),
            data["rounds"],
        )


def _by_method(found: dict[str, dict], make: Callable[[dict], object]) -> dict[str, dict]:
    """A ladder.json table (place -> method -> value) with each value made a record."""
    return {place: {method: make(value) for method, value in by.items()} for place, by in found.items()}


def ladder_report(config: LadderConfig) -> Path:
    """Write the ladder's ladder.json (every number), report.json (what it read) and README.md into
    ``config.out``."""
    offline = Rung(config.offline, synchronised=False)
    rungs = [Rung(folder, synchronised=True) for folder in config.rungs]
    seeds = [s for s in rungs[0].counts.seeds if all(s in r.counts.seeds for r in [offline, *rungs])]
    if not seeds:
        raise UserError("the offline compare and the rungs share no seed")
    ladder = Ladder(
        seeds=seeds,
        methods=list(offline.counts.methods),
        rungs=[r.name for r in rungs],
        against_offline=_against_offline(offline, rungs, seeds),
        claim_above=_claim_above([offline, *rungs], seeds),
        steps=_steps(rungs, offline, seeds),
        falls=_falls([offline, *rungs], seeds),
        rounds={r.name: _round_means(r) for r in rungs},
    )
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    ladder.write(out)
    render.write_readme(out, ReportData("ladder", (_heading(config, rungs, seeds),)), ladder_sections(ladder))
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


def _against_offline(
    offline: Rung, rungs: list[Rung], seeds: list[int]
) -> dict[str, dict[str, BesideOffline]]:
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
            m: BesideOffline(points(a, n), points(b, n), j.kept())
            for m, (a, b), j in zip(methods, pairs, judged, strict=True)
        }
    return found


def _claim_above(rungs: list[Rung], seeds: list[int]) -> dict[str, dict[str, Verdict]]:
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
        found[rung.name] = {m: j.kept() for m, j in zip(others, stats.judge(intervals), strict=True)}
    return found


def _steps(rungs: list[Rung], offline: Rung, seeds: list[int]) -> dict[str, dict[str, Verdict]]:
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
        found[f"{smaller.name} → {larger.name}"] = {m: j.kept() for m, j in zip(methods, judged, strict=True)}
    return found


def _falls(rungs: list[Rung], seeds: list[int]) -> dict[str, dict[str, Fall]]:
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
            m: Fall(points(p, n), points(f, n), j.kept())
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


def _heading(config: LadderConfig, rungs: list[Rung], seeds: list[int]) -> Section:
    """What the ladder read: the offline compare, the rungs and their shared seeds."""
    rung_list = ", ".join(f"`{r.folder}` ({r.name})" for r in rungs)
    text = (
        f"Offline compare: `{config.offline}` (every update replays the pool π0 sampled: N = U). Rungs:"
        f" {rung_list}. Seeds {', '.join(map(str, seeds))}, paired by seed and problem; intervals are t on"
        " seeds − 1 df with Holm per family (`compare/stats.py`). With --sync-every N the policy samples a"
        " new round of N × G mixed-reward groups every N updates from the pool's next prompts (Algorithm 1);"
        " round 0 is the pool."
    )
    return Section("heading", "# The staleness ladder", (prose(text),))


def ladder_sections(ladder: Ladder) -> list[Section]:
    """The ladder's tables, from ladder.json alone."""
    return [
        _against_offline_table(ladder),
        _claims_table(ladder),
        _steps_table(ladder),
        _falls_table(ladder),
        _rounds_table(ladder),
    ]


def _against_offline_table(ladder: Ladder) -> Section:
    """A row per offline method some rung trained ("—" where a rung did not)."""
    header = ("method", OFFLINE, *(f"{r} (− offline [95 %])" for r in ladder.rungs))
    rows = []
    for method in [m for m in ladder.methods if any(m in by for by in ladder.against_offline.values())]:
        cells = [ladder.against_offline[rung].get(method) for rung in ladder.rungs]
        offline_mean = next(cell.offline for cell in cells if cell is not None)
        row = [display(method), number("{:.2f}", offline_mean)]
        row += [
            "—" if c is None else number("{:.2f}", c.rung).then(c.difference.number(), " (", ")")
            for c in cells
        ]
        rows.append(tuple(row))
    title = "## Each method at each N beside its offline self (test, selected checkpoint)"
    return Section("against offline", title, (Table(header, tuple(rows), "l" + "r" * (len(header) - 1)),))


def _claims_table(ladder: Ladder) -> Section:
    claims = ladder.claim_above
    others = sorted({m for by in claims.values() for m in by}, key=ladder.methods.index)
    names = [name for name in [OFFLINE, *ladder.rungs] if name in claims]
    rows = tuple(
        (name, *(v.number() if (v := claims[name].get(m)) else "—" for m in others)) for name in names
    )
    header = ("N", *(f"GGPO − {display(m)}" for m in others))
    title = "## GGPO above the others at each N (test, selected checkpoint; each N one family)"
    return Section("claims", title, (Table(header, rows, "l" + "r" * len(others)),))


def _steps_table(ladder: Ladder) -> Section:
    steps = ladder.steps
    methods = [m for m in ladder.methods if any(m in by for by in steps.values())]
    rows = tuple(
        (step, *(v.number() if (v := by.get(m)) else "—" for m in methods)) for step, by in steps.items()
    )
    title = "## Each method as N grows (test, selected checkpoint: larger N − smaller; each step one family)"
    return Section("steps", title, (Table(("N", *map(display, methods)), rows, "l" + "r" * len(methods)),))


def _falls_table(ladder: Ladder) -> Section:
    rows = tuple(
        (name, display(m), number("{:.2f}", v.peak), number("{:.2f}", v.final), v.fall.number())
        for name in [OFFLINE, *ladder.rungs]
        for m, v in ladder.falls[name].items()
    )
    header = ("N", "method", "peak", "final", "peak − final [95 %]")
    title = "## The fall after the peak (validation: selected − final, paired within each run)"
    return Section("falls", title, (Table(header, rows, "llrrr"),))


def _rounds_table(ladder: Ladder) -> Section:
    found = {k for by in ladder.rounds.values() for v in by.values() for k in v}
    ages = sorted((k for k in found if k.startswith(MISMATCH_K3 + "@")), key=lambda k: int(k.split("@")[1]))
    header = ("N", "method", *ROUND_METRICS, *ages)
    rows = tuple(
        (name, display(m), *("—" if k not in v else number("{:.4g}", v[k]) for k in [*ROUND_METRICS, *ages]))
        for name, by in ladder.rounds.items()
        for m, v in by.items()
    )
    note = prose(
        f"`{MISMATCH_K3}@a`: the update's K3 between the learner and the engine's log-probs of the round it "
        "trains on, a updates after the round was sampled. Every number: `ladder.json`; each rung's own "
        "report (frontier, matched drift, figures) is its compare's README."
    )
    title = "## The rounds' mismatch (every round of every seed, on the policy that sampled it)"
    return Section("rounds", title, (Table(header, rows, "ll" + "r" * (len(header) - 2)), note))
