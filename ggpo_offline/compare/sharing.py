"""Compares run side by side on one report folder share its runs: each run is trained by the first compare
that claims it; another goes on to its next run, then waits for that one and reuses it."""

import fcntl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

CLAIMS_FOLDER = ".claims"
"""Inside the report folder: one lock file per run, and one for writing the report."""
REPORT_CLAIM = "report"

Run = TypeVar("Run")


@contextmanager
def claim(report_dir: Path, name: str, wait: bool = True) -> Iterator[bool]:
    """Hold ``name``'s claim in ``report_dir`` for the block: True once held. An exclusive `flock`, so a
    compare that dies lets go of its claims; without ``wait``, False at once when another process holds it.
    The lock files stay (deleting one would let two processes lock two files of the same name)."""
    folder = report_dir / CLAIMS_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True  # closing the file lets go


def take_turns(runs: list[Run], report_dir: Path, name: Callable[[Run], str]) -> Iterator[tuple[int, Run]]:
    """Every run with its position, in order, each while this process holds its claim; a run another compare
    holds comes after the others, once that compare lets go of it (it has usually finished it: the caller
    decides what is left to do)."""
    held_elsewhere = []
    for position, run in enumerate(runs):
        with claim(report_dir, name(run), wait=False) as held:
            if held:
                yield position, run
            else:
                held_elsewhere.append((position, run))
    for position, run in held_elsewhere:
        with claim(report_dir, name(run)):
            yield position, run
