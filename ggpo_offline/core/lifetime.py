"""Processes that end with the process that started them, whichever way that one ended."""

import multiprocessing
import os
import threading
import time

WATCH_S = 1.0


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
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()
