"""Stops a multiprocessing Pool for good, also after one of its workers was killed, and reports such deaths.

Everything here reads CPython's private Pool state (``multiprocessing/pool.py``, the same from 3.8 to
3.13), so that no other module does.
"""

from __future__ import annotations

import threading
from multiprocessing.pool import TERMINATE, Pool
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Lock

# Stopping a pool whose worker died halfway through a message may still block in Pool.terminate (it
# reads the rest of that message): after this long the daemon thread doing it is left behind.
TERMINATE_WAIT_S = 30.0
# The pool's own threads hold the result queue's write lock only for one pipe write, so that lock still
# held after this long is held by a killed worker.
LOCK_WAIT_S = 1.0


class WatchedPool(Pool):
    """A Pool that keeps every worker process it has started, also those it has already replaced.

    The pool drops a dead worker from its own list and starts another within 0.1 s, even before its
    constructor returns, so a list read from it can miss a death; this one cannot.
    """

    def __init__(self, *args, **kwargs) -> None:
        self._started: list[BaseProcess] = []  # before Pool.__init__, which starts the first workers
        super().__init__(*args, **kwargs)

    def Process(self, ctx, *args, **kwargs) -> BaseProcess:  # noqa: N802 (Pool's own name for the hook)
        # Pool's staticmethod, called as self.Process by the constructor and the worker handler thread.
        process = super().Process(ctx, *args, **kwargs)
        self._started.append(process)
        return process


def worker_processes(pool: WatchedPool) -> list[BaseProcess]:
    """Every worker process ``pool`` has started, dead or alive, oldest first (one the pool's thread is
    starting right now comes once it has a pid)."""
    return [process for process in pool._started if process.pid is not None]


def _free(lock: Lock, wait_s: float) -> None:
    # Waits out a live holder; a lock still held after ``wait_s`` belongs to a dead worker and is freed.
    lock.acquire(timeout=wait_s)
    lock.release()


def discard(pool: Pool) -> None:
    """Stop ``pool`` and kill its workers, also when a killed worker left one of its queue locks held.

    ``Pool.terminate`` takes the task queue's read lock, which an idle worker holds while it waits for a
    task, and the result queue's write lock, which a worker holds while it sends a result: once such a
    worker is killed, the other workers and terminate itself wait for that lock forever. So this first
    does terminate's first step (no more replacement workers), kills every worker and frees both locks,
    then terminates. A second call does nothing.
    """
    if pool._state == TERMINATE:
        return
    pool._worker_handler._state = TERMINATE
    pool._change_notifier.put(None)  # wakes the handler, which then stops
    pool._worker_handler.join()
    for worker in pool._pool:
        worker.kill()
    for worker in pool._pool:
        worker.join()
    _free(pool._inqueue._rlock, wait_s=0)  # only workers take it before terminate, and they are dead
    _free(pool._outqueue._wlock, wait_s=LOCK_WAIT_S)
    closer = threading.Thread(target=pool.terminate, name="pool-terminate", daemon=True)
    closer.start()
    closer.join(TERMINATE_WAIT_S)
