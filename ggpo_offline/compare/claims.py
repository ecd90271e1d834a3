"""The GGPO paper's offline claims (Table 5 / Figure 4), each checked with paired intervals and a verdict."""

from ggpo_offline.compare import stats
from ggpo_offline.compare.blocks import Block, prose
from ggpo_offline.compare.counts import BASE, SELECTED
from ggpo_offline.compare.score_tables import csv_row, display, headline, validation_declines
from ggpo_offline.compare.scores import At, Scores

FROM = (2, 5)
"""Claim (a) starts at 2/5 of the run: the paper's update 160 of 400."""


def directional(family: list[stats.Judged], sign: int = 1) -> str:
    """A claim's verdict from its intervals judged as one Holm family: resolved when every one is resolved
    on the claimed side (above 0 for ``sign`` 1, below for -1); resolved against when one is resolved on the
    other side; too few seeds when the seeds cannot give a verdict; not resolved otherwise."""
    if any(j.verdict == stats.TOO_FEW_SEEDS for j in family):
        return stats.TOO_FEW_SEEDS
    if all(j.resolved and sign * j.interval.mean > 0 for j in family):
        return "resolved"
    if any(j.resolved and sign * j.interval.mean < 0 for j in family):
        return "resolved against"
    return "not resolved"


class Claims:
    """The claim lines and their table.csv rows; a claim whose methods were not run is left out."""

    def __init__(self, scores: Scores, methods: list[str]):
        self.scores, self.methods = scores, methods
        self.counts = scores.counts
        self.val = headline(scores, "validation")
        self.last = self.counts.final("validation")
        self.tested = "test" in self.counts.splits
        self.lines: list[str] = []
        self.rows: list[dict] = []

    def section(self) -> tuple[list[Block], list[dict]]:
        for claim in (self.highest, self.near_base, self.declines, self.mid_training):
            claim()
        if not self.lines:
            return [], []
        blocks = [
            prose("### The paper's offline claims, with paired 95 % intervals"),
            prose(
                "Each claim's intervals are one family (Holm, its size in brackets). **resolved**: every one"
                " is resolved on the claimed side; **resolved against**: one is resolved on the other side;"
                " **not resolved**: the data cannot tell at this size; **too few seeds**: one seed cannot"
                " say."
            ),
            prose(*self.lines),
        ]
        return blocks, self.rows

    def _family(self, claim: str, items: list[tuple]) -> list[stats.Judged]:
        """``items`` (terms, method, versus, at) judged as one family, each with its table.csv row."""
        family = stats.judge([self.scores.contrast(terms) for terms, *_ in items])
        for (_, method, versus, at), judged in zip(items, family, strict=True):
            metric = f"mean@{self.counts.n[at.split]}"
            self.rows.append(csv_row(f"claim {claim}", at, method, metric, versus=versus, judged=judged))
        return family

    def _places(self) -> list[tuple[At, str]]:
        """Validation from 2/5 of the run on, then test at the selected and final checkpoints."""
        share, whole = FROM
        late = [u for u in self.counts.updates("validation") if whole * u >= share * self.last]
        places = [(At("validation", self.val, u), f"validation update {u}") for u in late]
        if self.tested:
            scope = headline(self.scores, "test")
            places += [(At("test", scope, SELECTED), "test, selected checkpoint")]
            places += [(At("test", scope, self.counts.final("test")), "test, final checkpoint")]
        return places

    def highest(self) -> None:
        """(a) GGPO − each other method at every place from 2/5 of the run on."""
        others = [m for m in self.methods if m != "ggpo"]
        if "ggpo" not in self.methods or not others:
            return
        places = self._places()
        items = [(((1, "ggpo", at), (-1, o, at)), "ggpo", o, at) for at, _ in places for o in others]
        family = iter(self._family("a", items))
        found, nested = [], []
        for _, label in places:
            pairs = [(o, next(family)) for o in others]
            found += [(label, o, j) for o, j in pairs]
            listing = "; ".join(f"vs {display(o)} {j.interval.text()}" for o, j in pairs)
            nested.append(f"  - {label}: {listing}")
        word = directional([j for _, _, j in found])
        label, other, weakest = min(found, key=lambda x: x[2].interval.low)
        below = {o: sum(j.resolved and j.interval.mean < 0 for _, x, j in found if x == o) for o in others}
        against = [f"{display(o)} at {k} of {len(nested)}" for o, k in below.items() if k]
        tail = f"; GGPO resolved below {', '.join(against)} places" if against else ""
        self.lines += [
            f"- (a) GGPO is the highest from {FROM[0]}/{FROM[1]} of the run on (paper: every evaluation from"
            f" update 160 of 400): **{word}** [{len(found)}] — weakest GGPO − {display(other)} at {label}:"
            f" {weakest.interval.text()}{tail}. GGPO − each method:",
            *nested,
        ]

    def near_base(self) -> None:
        """(b) GRPO's final score against the base model and below every other method's (the claim's verdict:
        it stays near the base while the others move), and the range of its drift series."""
        if "grpo" not in self.methods:
            return
        end, start = At("validation", self.val, self.last), At("validation", self.val, 0)
        (moved,) = self._family("b", [(((1, "grpo", end), (-1, BASE, start)), "grpo", BASE, end)])
        others = [m for m in self.methods if m != "grpo"]
        below = self._family("b", [(((1, m, end), (-1, "grpo", end)), m, "grpo", end) for m in others])
        claim = directional(below) if below else "not resolved"
        behind = ", ".join(f"{display(m)} {j.interval.text()}" for m, j in zip(others, below, strict=True))
        word = {"resolved": "moved", "not resolved": "no move detected"}.get(moved.verdict, moved.verdict)
        self.lines.append(
            f"- (b) GRPO stays near the base model with near-constant drift (paper: 32.96 → 39.64 while the"
            f" others peak at 58–60): **{claim}** [{len(below)}] that every other method ends above GRPO"
            f" (each − GRPO at validation update {self.last}: {behind or 'no other method'}); GRPO − base"
            f" model {moved.interval.text()} ({word}); {self._drift('grpo')}."
        )

    def _drift(self, method: str) -> str:
        spans = []
        for seed in self.counts.seeds:
            values = [v for _, v in self.counts.drift.get((method, seed), ())]
            if values:
                spans.append(f"seed {seed} {min(values):.3g}–{max(values):.3g} (last {values[-1]:.3g})")
        if not spans:
            return "no drift was logged"
        return "token-mean |log π_θ/μ| over the run: " + ", ".join(spans)

    def declines(self) -> None:
        """(c) each method's decline after its peak, then GGPO's decline against each other's."""
        peaks, biased = validation_declines(self.scores, self.methods, self.val)  # the Table 5 rows'
        final = At("validation", self.val, self.last)
        chosen = biased
        if self.tested:
            chosen = self._family("c", [(self._test_decline(m), m, m, self._test()[0]) for m in self.methods])
        rows = []
        for method, validation, test in zip(self.methods, biased, chosen, strict=True):
            peak = At("validation", self.val, peaks[method])
            text = (
                f"  - {display(method)}: peak {self.scores.cell(method, peak).mean:.2f} at update"
                f" {peaks[method]}, final {self.scores.cell(method, final).mean:.2f}; validation decline"
                f" {validation.text()}"
            )
            if self.tested:
                text += f"; test decline (selected − final) {test.text()}"
            rows.append(text + ".")
        which = "test (selected − final checkpoint)" if self.tested else "validation (peak − final)"
        self.lines += [
            f"- (c) Every method declines after its peak (paper: GRPO+TIS 58.28 → 42.71, AGRO 57.91 → 46.43,"
            f" GGPO 59.79 → 48.31): **{directional(chosen)}** [{len(chosen)}] on the {which} declines. A peak"
            " picked as the maximum over validation evaluations is biased upward, and so is the validation"
            " decline; the test decline (checkpoint selected on validation, scored once on test) is not:",
            *rows,
        ]
        self._least(peaks)

    def _test(self) -> tuple[At, At]:
        scope = headline(self.scores, "test")
        return At("test", scope, SELECTED), At("test", scope, self.counts.final("test"))

    def _test_decline(self, method: str, sign: int = 1) -> tuple:
        selected, final = self._test()
        return ((sign, method, selected), (-sign, method, final))

    def _least(self, peaks: dict[str, int]) -> None:
        """GGPO's decline minus each other's, per seed and problem (a difference of differences)."""
        others = [m for m in self.methods if m != "ggpo"]
        if "ggpo" not in self.methods or not others:
            return
        final = At("validation", self.val, self.last)
        items = []
        for other in others:
            if self.tested:
                terms = self._test_decline("ggpo") + self._test_decline(other, -1)
                at = self._test()[0]
            else:
                at = At("validation", self.val, peaks["ggpo"])
                terms = ((1, "ggpo", at), (-1, "ggpo", final))
                terms += ((-1, other, At("validation", self.val, peaks[other])), (1, other, final))
            items.append((terms, "ggpo", other, at))
        family = self._family("c", items)
        pairs = zip(others, family, strict=True)
        listing = "; ".join(f"vs {display(o)} {j.interval.text()}" for o, j in pairs)
        which = "test" if self.tested else "validation"
        self.lines.append(
            f"- (c) GGPO declines least: **{directional(family, sign=-1)}** [{len(family)}] — GGPO's {which}"
            f" decline − each other method's: {listing}."
        )

    def mid_training(self) -> None:
        """(d) GRPO+TIS − GRPO at the validation evaluation nearest U/2 (the earlier one on ties)."""
        if "grpo" not in self.methods or "grpo-tis" not in self.methods:
            return
        middle = min(self.counts.updates("validation"), key=lambda u: (abs(2 * u - self.last), u))
        at = At("validation", self.val, middle)
        (judged,) = self._family("d", [(((1, "grpo-tis", at), (-1, "grpo", at)), "grpo-tis", "grpo", at)])
        self.lines.append(
            f"- (d) GRPO+TIS ≥ GRPO at mid-training (paper: 57.93 vs 38.36 at update 160 of 400): at"
            f" validation update {middle}, GRPO+TIS − GRPO {judged.interval.text()},"
            f" **{directional([judged])}**."
        )
