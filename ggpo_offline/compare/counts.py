"""The raw per-problem correct counts of a comparison (counts.json): read from run records or the file."""

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ggpo_offline.compare.finished_runs import RunRecord
from ggpo_offline.core.errors import UserError, replace_text
from ggpo_offline.train.metric_names import MISMATCH_DRIFT, PROBE_METRICS, UPDATE

COUNTS_FILE = "counts.json"
FORMAT = "ggpo-offline counts 1"
SPLITS = ("validation", "test")
"""validation: the in-training evaluations (training and checkpoint selection read them); test: evaluated
once per run at the end, for the selected and the final checkpoint."""
DRIFT_DIGITS = 6
"""Significant digits kept of the drift series, on reading the runs as on reading the file, so that a table
recomputed from counts.json matches the one written beside it."""

SUITE = "suite"
"""The scope of all benchmarks of a split together, problem-weighted."""
BASE = "base"
"""The initial model as a row of the tables: each seed's evaluation at update 0."""
SELECTED = "selected"
"""The checkpoint of each run chosen on validation (best mean@n, earliest on ties)."""

Key = tuple[str, int, str, int]
"""(method, seed, split, update) of one evaluation."""


@dataclass(frozen=True)
class Counts:
    """Every evaluation of a comparison as per-problem correct counts, in one prompt order per benchmark."""

    methods: tuple[str, ...]
    seeds: tuple[int, ...]
    n: dict[str, int]
    """Samples per problem, by split."""
    ks: dict[str, tuple[int, ...]]
    """The pass@k values reported, by split."""
    prompts: dict[str, dict[str, tuple[str, ...]]]
    """split -> benchmark -> prompt ids, in the order of every count array."""
    correct: dict[Key, dict[str, tuple[int, ...]]]
    """(method, seed, split, update) -> benchmark -> correct count of each prompt."""
    selected: dict[tuple[str, int], int]
    """(method, seed) -> the checkpoint selected on validation (its test evaluation is reported)."""
    drift: dict[tuple[str, int], tuple[tuple[int, float], ...]]
    """(method, seed) -> (update, token-mean |log π_θ/μ|) of every update that logged it."""
    probe: dict[tuple[str, int], tuple[tuple[int, float, float], ...]] = field(default_factory=dict)
    """(method, seed) -> (update, probe K3, probe log-ratio) of every evaluated checkpoint: its drift from
    π0 (`ggpo_offline.train.metric_names.PROBE_METRICS`); empty for runs that measured none."""

    @classmethod
    def from_records(cls, records: list[RunRecord], methods: list[str], seeds: list[int]) -> "Counts":
        """The counts of finished runs; UserError when they were not evaluated on the same problems."""
        n, ks, prompts, correct = {}, {}, {}, {}
        for record in records:
            for split, reports in (("validation", record.evals), ("test", record.tests)):
                for update, report in sorted(reports.items()):
                    where = f"{record.run_dir.name} {split} update {update}"
                    _agree(n, split, report.n, where, "samples per problem")
                    _agree(ks, split, report.ks, where, "pass@k values")
                    by_benchmark = {}
                    for name, scores in report.benchmarks.items():
                        order = prompts.setdefault(split, {}).setdefault(name, tuple(scores.counts))
                        if set(order) != set(scores.counts):
                            raise UserError(
                                f"{where}: {name} was evaluated on other problems than the first run"
                            )
                        by_benchmark[name] = tuple(int(scores.counts[p]) for p in order)
                    if set(by_benchmark) != set(prompts[split]):
                        raise UserError(f"{where}: evaluated other benchmarks than the first run")
                    correct[(record.method, record.seed, split, update)] = by_benchmark
        selected = {
            (r.method, r.seed): r.result.selected_update
            for r in records
            if r.result.selected_update is not None
        }
        drift = {(r.method, r.seed): _series(r.metrics, (MISMATCH_DRIFT,)) for r in records}
        probe = {(r.method, r.seed): _series(r.metrics, PROBE_METRICS) for r in records}
        probe = probe if all(probe.values()) else {}  # a frontier needs every run's
        counts = cls(tuple(methods), tuple(seeds), n, ks, prompts, correct, selected, drift, probe)
        counts.check()
        return counts

    @classmethod
    def read(cls, path: Path) -> "Counts":
        """Load counts.json as written by ``write``."""
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise UserError(f"{path} is not a counts file of this version (format {data.get('format')!r})")
        counts = cls(
            methods=tuple(data["methods"]),
            seeds=tuple(data["seeds"]),
            n=dict(data["n"]),
            ks={split: tuple(ks) for split, ks in data["ks"].items()},
            prompts={s: {b: tuple(ids) for b, ids in names.items()} for s, names in data["prompts"].items()},
            correct={
                (e["method"], e["seed"], e["split"], e["update"]): {
                    b: tuple(c) for b, c in e["counts"].items()
                }
                for e in data["evaluations"]
            },
            selected={
                (m, int(s)): u for m, by_seed in data["selected_update"].items() for s, u in by_seed.items()
            },
            drift={
                (m, int(s)): tuple((u, v) for u, v in series)
                for m, by_seed in data["drift"].items()
                for s, series in by_seed.items()
            },
            probe={
                (m, int(s)): tuple(tuple(point) for point in series)
                for m, by_seed in data.get("probe", {}).items()
                for s, series in by_seed.items()
            },
        )
        counts.check()
        return counts

    def write(self, path: Path) -> None:
        """counts.json: the header fields one per line, then one line per evaluation (small, diffable)."""
        header = {
            "format": FORMAT,
            "about": "correct samples (of n) per problem of every evaluation; table.md is computed from it",
            "methods": list(self.methods),
            "seeds": list(self.seeds),
            "n": self.n,
            "ks": {split: list(ks) for split, ks in self.ks.items()},
            "prompts": {s: {b: list(ids) for b, ids in names.items()} for s, names in self.prompts.items()},
            "selected_update": _by_method_seed(self.selected),
            "drift": _by_method_seed({key: [list(p) for p in s] for key, s in self.drift.items()}),
        }
        if self.probe:  # counts of runs without a probe keep their bytes
            header["probe"] = _by_method_seed({key: [list(p) for p in s] for key, s in self.probe.items()})
        lines = [f" {json.dumps(key)}: {json.dumps(value)}," for key, value in header.items()]
        evaluations = [
            json.dumps({"method": m, "seed": s, "split": split, "update": u, "counts": by_benchmark})
            for (m, s, split, u), by_benchmark in self.correct.items()
        ]
        lines.append(' "evaluations": [\n  ' + ",\n  ".join(evaluations) + "\n ]")
        replace_text(path, "{\n" + "\n".join(lines) + "\n}\n")

    def check(self) -> None:
        """Every run evaluated at the same validation updates, and on test (when any was) at the same final
        update and at its selected one, so that every pair of methods can be compared problem by problem."""
        runs = [(m, s) for m in self.methods for s in self.seeds]
        grid = {run: self._updates(run, "validation") for run in runs}
        if not grid[runs[0]] or any(updates != grid[runs[0]] for updates in grid.values()):
            listing = ", ".join(f"{m}-s{s}: {sorted(u)}" for (m, s), u in grid.items())
            raise UserError(f"the runs were not all evaluated at the same validation updates ({listing})")
        if "test" not in self.prompts:
            return
        tests = {run: self._updates(run, "test") for run in runs}
        finals = {max(updates, default=None) for updates in tests.values()}
        if len(finals) > 1:
            listing = ", ".join(f"{m}-s{s}: {sorted(u)}" for (m, s), u in tests.items())
            raise UserError(f"the runs were not all evaluated on test at the same final update ({listing})")
        for (method, seed), update in self.selected.items():
            if update not in tests[method, seed]:
                raise UserError(f"{method}-s{seed}: no test evaluation of its selected update {update}")

    def _updates(self, run: tuple[str, int], split: str) -> set[int]:
        return {u for m, s, sp, u in self.correct if (m, s, sp) == (*run, split)}

    @property
    def splits(self) -> list[str]:
        """The splits evaluated, in SPLITS order (test is absent for runs without a test evaluation)."""
        return [split for split in SPLITS if split in self.prompts]

    def updates(self, split: str) -> list[int]:
        """The updates every run evaluated on ``split`` (on test: the final one, and 0 when the base model
        was evaluated there)."""
        each = [self._updates((m, s), split) for m in self.methods for s in self.seeds]
        return sorted(set.intersection(*each))

    def final(self, split: str) -> int:
        return self.updates(split)[-1]

    def selected_updates(self, method: str) -> tuple[int, ...]:
        """The checkpoint of each seed's run of ``method`` selected on validation; the final one for a run
        that recorded none."""
        final = self.final("test") if "test" in self.prompts else self.final("validation")
        return tuple(self.selected.get((method, seed), final) for seed in self.seeds)

    def has_base(self, split: str) -> bool:
        """Whether the base model (update 0) was evaluated on ``split`` for every seed."""
        return all(any((m, s, split, 0) in self.correct for m in self.methods) for s in self.seeds)

    def scopes(self, split: str) -> list[str]:
        """The benchmarks of ``split``, then the suite when there are several."""
        names = list(self.prompts[split])
        return names + [SUITE] if len(names) > 1 else names

    def matrix(self, method: str, split: str, scope: str, checkpoint: int | str) -> np.ndarray:
        """Correct counts ``[seeds, problems]`` of ``method`` (or BASE) at an update (or SELECTED)."""
        names = list(self.prompts[split]) if scope == SUITE else [scope]
        rows = []
        for seed, update in zip(self.seeds, self.checkpoints(method, checkpoint), strict=True):
            if method == BASE:
                owner = next(m for m in self.methods if (m, seed, split, 0) in self.correct)
                by_benchmark = self.correct[owner, seed, split, 0]
            else:
                by_benchmark = self.correct[method, seed, split, update]
            rows.append([c for name in names for c in by_benchmark[name]])
        return np.array(rows, dtype=np.int64)

    def probe_k3(self, method: str, seed: int) -> list[tuple[int, float]]:
        """(update, probe K3) of the run's validation checkpoints, in update order."""
        evaluated = self._updates((method, seed), "validation")
        return [(update, k3) for update, k3, _ in self.probe[method, seed] if update in evaluated]

    def checkpoints(self, method: str, checkpoint: int | str) -> tuple[int, ...]:
        """The update of each seed's run that ``checkpoint`` (an update, or SELECTED) names."""
        if method == BASE:
            return (0,) * len(self.seeds)
        if checkpoint == SELECTED:
            return self.selected_updates(method)
        return (int(checkpoint),) * len(self.seeds)


def _agree(found: dict, split: str, value, where: str, what: str) -> None:
    if found.setdefault(split, value) != value:
        raise UserError(f"{where}: {what} {value} differ from the first run's {found[split]}")


def _series(metrics: list[dict], names: tuple[str, ...]) -> tuple[tuple, ...]:
    """(update, *values of ``names``) of every record that logged them all, each to DRIFT_DIGITS digits."""
    return tuple(
        (record[UPDATE], *(float(f"{record[name]:.{DRIFT_DIGITS}g}") for name in names))
        for record in metrics
        if all(record.get(name) is not None for name in names)
    )


def _by_method_seed(values: dict[tuple[str, int], object]) -> dict[str, dict[str, object]]:
    nested: dict[str, dict[str, object]] = {}
    for (method, seed), value in values.items():
        nested.setdefault(method, {})[str(seed)] = value
    return nested
