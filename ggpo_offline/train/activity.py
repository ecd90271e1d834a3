"""What each process of a training job is doing, kept in a file that outlives it: a process killed by a
signal cannot say what it was doing, so the launcher reads it there."""

import os
import signal
from pathlib import Path

FOLDER_VARIABLE = "GGPO_ACTIVITY_DIR"  # set by the launcher in each worker; unset, nothing is written
# "<rank>:<activity>": that process stops itself (SIGSTOP) on reaching the activity, so that a test or the
# chaos run can freeze or kill it at an exact point instead of at a moment that depends on the machine's load.
STOP_VARIABLE = "GGPO_STOP_AT"


def launched_by_ggpo() -> bool:
    """Whether this process is a worker of `ggpo train --nproc` (whose launcher reports its failures)."""
    return FOLDER_VARIABLE in os.environ


def activity_file(folder: Path | str, rank: int) -> Path:
    return Path(folder, f"rank-{rank:03d}.doing")


def doing(what: str) -> None:
    """Record that this process is now ``what`` ("training update 4"); a no-op outside the launcher."""
    rank = int(os.environ.get("RANK", "0"))
    folder = os.environ.get(FOLDER_VARIABLE)
    if folder is not None:
        path = activity_file(folder, rank)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(what)
        os.replace(tmp, path)  # the launcher never reads half a line
    if os.environ.get(STOP_VARIABLE) == f"{rank}:{what}":
        os.kill(os.getpid(), signal.SIGSTOP)


def last_doing(folder: Path | str, rank: int) -> str | None:
    """What process ``rank`` last recorded, None when it recorded nothing."""
    path = activity_file(folder, rank)
    return path.read_text() if path.is_file() else None
