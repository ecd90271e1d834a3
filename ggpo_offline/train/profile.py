"""Where a run's wall time goes: each phase timed as it runs, for the run's own profile.jsonl (`RunFolder`).

Not in metrics.jsonl, which must be byte-identical between replays of one run: times never are. A resumed
run appends to the file, so it holds every stretch of work the run has cost, a killed one included.
"""

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PHASES = {
    "process": "from the process's start to its first run's start: imports (torch, transformers), the CLI",
    "inputs": "reading and checking the pool, its index and the data plan",
    "pi0": "π0's log-probs of the pool's responses (the reference of the methods that have one)",
    "sampler": "the pool's sampler against the learner, measured on π0's log-probs at update 0 (sampler/*)",
    "model": "loading the initial (or resumed) weights and the tokenizer",
    "anchors": "π_ref / π_old refreshes: no-gradient forwards over the minibatches they will serve",
    "forward_backward": "the update's log-probs, loss and backward, every micro-batch",
    "optimizer": "the update's loss summed over ranks, gradient clipping and the optimizer step",
    "checkpoint": "writing a checkpoint (weights and resume state)",
    "round_engine": "a --sync-every round's engine started or given its checkpoint; its prompts encoded",
    "round_sampling": "the round's responses sampled and decoded",
    "round_scoring": "waiting for the round's rewards (scored while the next batch samples: what is left)",
    "round_writing": "the round's batches stored and its pool written",
    "round_index": "reading and indexing the round's pool",
    "round_reference": (
        "π_ref's log-probs of the round's responses (the methods that have one); a run of one process on one "
        "thread scores them beside its update's forward, and this is its wait for them"
    ),
    "round_assemble": "--lag mixed: the round's pool written from one share of each version's sample",
    "round_rescore": "--behavior-logprobs learner: the learner's log-probs of the round on its sampler",
    "round_diagnostics": "a round of several updates: its mismatch, entropy and length (one forward)",
    "probe": "the drift from π0 at an evaluated checkpoint: a no-gradient forward over the fixed probe",
    "evaluate": "a validation evaluation: engine start or weight load, sampling and scoring",
    "test": "the test evaluations of the selected, final and initial checkpoints",
    "final": "writing the final weights",
}
"""Every phase a profile records, with what it covers."""
TRAINING_PHASES = (
    "inputs",
    "model",
    "anchors",
    "sampler",
    "forward_backward",
    "optimizer",
    "checkpoint",
    *(phase for phase in PHASES if phase.startswith("round_")),
    "probe",
    "final",
)
"""A run's own training; its process start-up and π0 are a compare's, paid once for all its runs."""


@dataclass(frozen=True)
class PhaseTime:
    """One timed stretch of a run: ``phase`` (a key of PHASES), the update it belongs to, wall seconds."""

    phase: str
    update: int | None
    seconds: float


def seconds_since_process_start() -> float | None:
    """Wall seconds since this process started (Linux's /proc); None where that cannot be read."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


class RunProfile:
    """The phase times of one run in this process, taken by `Run` with the run's metrics (`Run.flush`)."""

    _process_counted = False  # a process's start-up belongs to the first run it trains

    def __init__(self) -> None:
        self.pending: list[PhaseTime] = []

    @classmethod
    def of_first_run(cls) -> "RunProfile":
        """A profile that starts with the "process" phase when this is the process's first run."""
        profile = cls()
        if not RunProfile._process_counted:
            RunProfile._process_counted = True
            started = seconds_since_process_start()
            if started is not None:
                profile.pending.append(PhaseTime("process", None, round(started, 3)))
        return profile

    @contextmanager
    def phase(self, phase: str, update: int | None = None) -> Iterator[dict[str, float]]:
        """Time the block as ``phase`` (of ``update``); a block that raises is not recorded. Seconds the
        block puts in the dict it is given, by phase, are recorded as those phases and carved out of its
        own (a round's sampling, timed where it ran)."""
        start = time.perf_counter()
        parts: dict[str, float] = {}
        yield parts
        elapsed = time.perf_counter() - start - sum(parts.values())
        self.pending += [PhaseTime(name, update, round(seconds, 4)) for name, seconds in parts.items()]
        self.pending.append(PhaseTime(phase, update, round(elapsed, 4)))

    def take(self) -> list[PhaseTime]:
        """The phases timed since the last take (`Run` appends them to the run's profile.jsonl)."""
        taken, self.pending = self.pending, []
        return taken


def phase_totals(times: list[PhaseTime]) -> dict[str, tuple[int, float]]:
    """(how many times, total seconds) per phase, in PHASES order."""
    totals: dict[str, tuple[int, float]] = {}
    for name in PHASES:
        mine = [record.seconds for record in times if record.phase == name]
        if mine:
            totals[name] = (len(mine), sum(mine))
    return totals
