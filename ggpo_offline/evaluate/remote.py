"""An `Evaluator` in a process of its own, out of reach of a torchrun job's process group, with a bound on
every wait for it."""

import multiprocessing
import os
import time
from pathlib import Path

from ggpo_offline.core.errors import JobFailure, UserError, how_it_ended, one_line
from ggpo_offline.core.lifetime import exit_with_parent
from ggpo_offline.evaluate.config import EvalConfig
from ggpo_offline.evaluate.report import EvalReport

# What torchrun tells its workers; an engine that sees them (or an initialized process group) joins the
# training job's collectives and waits forever for ranks that never call them.
LAUNCHER_VARIABLES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
)  # fmt: skip
LAUNCHER_PREFIXES = ("TORCHELASTIC_", "TORCH_ELASTIC_")
POLL_S = 0.5


class RemoteEvaluator:
    """``Evaluator(config)`` run in a clean spawned process (no torch.distributed variables, no process
    group), kept across checkpoints so its engine starts once. Every call waits at most ``timeout_s``; a
    dead, failing or overdue engine process ends the call with a `JobFailure` line saying how it ended."""

    def __init__(self, config: EvalConfig, timeout_s: float):
        self.timeout_s = timeout_s
        context = multiprocessing.get_context("spawn")
        self._conn, child_end = context.Pipe()
        # Not a daemon: the evaluator starts reward worker processes of its own.
        self._process = context.Process(target=_serve, args=(child_end, config), name="ggpo-evaluation")
        self._process.start()
        child_end.close()
        self._ask(("check", None, None), "checking the evaluation benchmarks")

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def evaluate(self, model: str | Path, protocol: EvalConfig | None = None) -> EvalReport:
        """The report of ``model`` under the process's protocol, or under ``protocol`` on the same engine
        (`Evaluator.lend`); it crosses the pipe pickled, as the same `EvalReport`."""
        return self._ask(("evaluate", protocol, str(model)), f"evaluating {Path(model).name}")

    def lend(self, config: EvalConfig) -> "LentRemote":
        """``config``'s protocol on this process's engine (what `Evaluator.lend` gives in-process)."""
        return LentRemote(self, config)

    def close(self) -> None:
        if self._process.is_alive():
            try:
                self._conn.send(("stop", None, None))
            except OSError:
                pass
            self._process.join(timeout=60)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()

    def _ask(self, request: tuple, doing: str):
        try:
            self._conn.send(request)
        except OSError:  # the process is gone and its end of the pipe with it
            raise self._died(doing) from None
        deadline = time.monotonic() + self.timeout_s
        while not self._conn.poll(POLL_S):
            if not self._process.is_alive():
                raise self._died(doing)
            if time.monotonic() > deadline:
                self._process.kill()
                raise JobFailure(
                    f"the evaluation engine (process {self.pid}) took more than {self.timeout_s:g} s "
                    f"{doing} and was stopped (--wait-timeout)"
                )
        try:
            kind, value = self._conn.recv()
        except (EOFError, OSError):
            raise self._died(doing) from None
        if kind == "error":
            raise UserError(value)
        if kind == "failed":
            raise JobFailure(f"the evaluation engine (process {self.pid}) failed {doing}: {value}")
        return value

    def _died(self, doing: str) -> JobFailure:
        self._process.join(timeout=10)
        return JobFailure(
            f"the evaluation engine (process {self.pid}) {how_it_ended(self._process.exitcode)} while {doing}"
        )


class LentRemote:
    """Another protocol on a `RemoteEvaluator`'s engine, with `Evaluator`'s evaluate/context interface."""

    def __init__(self, remote: RemoteEvaluator, config: EvalConfig):
        self.remote, self.config = remote, config

    def evaluate(self, model: str | Path) -> EvalReport:
        return self.remote.evaluate(model, self.config)

    def __enter__(self) -> "LentRemote":
        return self

    def __exit__(self, *exc) -> None:
        pass


def _serve(conn, config: EvalConfig) -> None:
    """The evaluation process: answer ("check" | "evaluate" | "stop", protocol, model) requests in order."""
    for name in [*LAUNCHER_VARIABLES, *(v for v in os.environ if v.startswith(LAUNCHER_PREFIXES))]:
        os.environ.pop(name, None)
    exit_with_parent()  # a training process killed mid-evaluation cannot stop this one
    from ggpo_offline.evaluate.evaluator import Evaluator

    evaluator = None
    try:
        while True:
            try:
                kind, protocol, model = conn.recv()
            except (EOFError, ConnectionError):  # the training process is gone (closed, or killed: a reset)
                return
            if kind == "stop":
                return
            try:
                evaluator = evaluator or Evaluator(config)
                answer = ("ok", _answer(evaluator, kind, protocol, model))
            except UserError as error:
                answer = ("error", str(error))
            except Exception as error:  # reported by the training process, which stops the job
                answer = ("failed", f"{type(error).__name__}: {one_line(error)}")
            try:
                conn.send(answer)
            except ConnectionError:  # the training process died meanwhile; it is the job that speaks
                return
    finally:
        if evaluator is not None:
            evaluator.close()


def _answer(evaluator, kind: str, protocol: EvalConfig | None, model: str | None) -> EvalReport | None:
    if kind == "check":
        return None
    if protocol is None:
        return evaluator.evaluate(model)
    with evaluator.lend(protocol) as lent:
        return lent.evaluate(model)
