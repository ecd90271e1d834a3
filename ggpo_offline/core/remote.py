"""A worker process of its own that keeps an engine started across requests: out of reach of a torchrun
job's process group, with a bound on every wait for it."""

import multiprocessing
import os
import time
from collections.abc import Callable

from ggpo_offline.core.errors import JobFailure, UserError, how_it_ended, one_line
from ggpo_offline.core.lifetime import exit_with_parent

# What torchrun tells its workers; an engine that sees them (or an initialized process group) joins the
# training job's collectives and waits forever for ranks that never call them.
LAUNCHER_VARIABLES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
)  # fmt: skip
LAUNCHER_PREFIXES = ("TORCHELASTIC_", "TORCH_ELASTIC_")
POLL_S = 0.5


class RemoteWorker:
    """``make_handler(setup)`` built once in a clean spawned process (no torch.distributed variables, no
    process group), which answers ``(kind, *arguments)`` requests in order with ``handler.answer``; the
    handler's ``close`` runs when the process stops. Every request waits at most ``timeout_s``; a dead,
    failing or overdue process ends the request with a `JobFailure` line naming ``what`` and how it
    ended, and a `UserError` the handler raised comes back as the same line."""

    def __init__(self, what: str, make_handler: Callable, setup, timeout_s: float):
        self.what, self.timeout_s = what, timeout_s
        context = multiprocessing.get_context("spawn")
        self._conn, child_end = context.Pipe()
        # Not a daemon: an engine starts reward worker processes of its own.
        self._process = context.Process(
            target=serve, args=(child_end, make_handler, setup), name=f"ggpo-{make_handler.__name__}"
        )
        self._process.start()
        child_end.close()
        self._unanswered: str | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def close(self) -> None:
        if self._process.is_alive():
            try:
                self._conn.send(("stop",))
            except OSError:
                pass
            self._process.join(timeout=60)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()

    def ask(self, request: tuple, doing: str):
        """The handler's answer to ``request``, waiting at most ``timeout_s``; ``doing`` names it in a
        failure's line."""
        self.send(request, doing)
        return self._answer(doing)

    def send(self, request: tuple, doing: str) -> None:
        """Send ``request`` without waiting: the process works on it while this one goes on. Its answer is
        read (and a failure raised) before the next request's."""
        self._collect()
        try:
            self._conn.send(request)
        except OSError:  # the process is gone and its end of the pipe with it
            raise self._died(doing) from None
        self._unanswered = doing

    def _collect(self) -> None:
        doing, self._unanswered = self._unanswered, None
        if doing is not None:
            self._answer(doing)

    def _answer(self, doing: str):
        self._unanswered = None
        deadline = time.monotonic() + self.timeout_s
        while not self._conn.poll(POLL_S):
            if not self._process.is_alive():
                raise self._died(doing)
            if time.monotonic() > deadline:
                self._process.kill()
                raise JobFailure(
                    f"{self.what} (process {self.pid}) took more than {self.timeout_s:g} s "
                    f"{doing} and was stopped (--wait-timeout)"
                )
        try:
            kind, value = self._conn.recv()
        except (EOFError, OSError):
            raise self._died(doing) from None
        if kind == "error":
            raise UserError(value)
        if kind == "failed":
            raise JobFailure(f"{self.what} (process {self.pid}) failed {doing}: {value}")
        return value

    def _died(self, doing: str) -> JobFailure:
        self._process.join(timeout=10)
        return JobFailure(
            f"{self.what} (process {self.pid}) {how_it_ended(self._process.exitcode)} while {doing}"
        )


def serve(conn, make_handler: Callable, setup) -> None:
    """The worker process: answer requests in order until "stop" or until the asking process is gone."""
    for name in [*LAUNCHER_VARIABLES, *(v for v in os.environ if v.startswith(LAUNCHER_PREFIXES))]:
        os.environ.pop(name, None)
    exit_with_parent()  # an asking process killed mid-request cannot stop this one
    handler = None
    try:
        while True:
            try:
                kind, *arguments = conn.recv()
            except (EOFError, ConnectionError):  # the asking process is gone (closed, or killed: a reset)
                return
            if kind == "stop":
                return
            try:
                handler = handler or make_handler(setup)
                answer = ("ok", handler.answer(kind, *arguments))
            except UserError as error:
                answer = ("error", str(error))
            except Exception as error:  # reported by the asking process, which stops the job
                answer = ("failed", f"{type(error).__name__}: {one_line(error)}")
            try:
                conn.send(answer)
            except ConnectionError:  # the asking process died meanwhile; it is the job that speaks
                return
    finally:
        if handler is not None:
            handler.close()
