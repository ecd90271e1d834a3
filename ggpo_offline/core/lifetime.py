"""Processes that end with the process that started them, whichever way that one ended."""

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

WATCH_S = 1.0


QUIET_TRACKER = "ignore::UserWarning:multiprocessing.resource_tracker"


def quiet_resource_tracker() -> None:
    """Keep multiprocessing's resource tracker (started with the first worker, from this environment) from
    warning about a killed worker's semaphores after the job's one error line."""
    warnings = os.environ.get("PYTHONWARNINGS", "")
    if QUIET_TRACKER not in warnings:
        os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [warnings, QUIET_TRACKER]))


def exit_with_parent() -> None:
    """End this process (and the processes it started) within ``WATCH_S`` of its parent's end: a parent
    killed by a signal cannot stop it, and an orphan would train or sample on for nobody, or write into a
    run folder that ``--resume`` is continuing."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCH_S)
        for child in multiprocessing.active_children():
            child.kill()
        for pid in _child_pids():  # one still being spawned is not in active_children yet
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def _child_pids() -> list[int]:
    """This process's children as the kernel knows them (Linux /proc; none found elsewhere)."""
    me, pids = os.getpid(), []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                # The field after the command name, which may itself hold spaces and parentheses.
                fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == me:
                    pids.append(int(entry.name))
    return pids
