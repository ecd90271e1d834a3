"""An `Evaluator` in a process of its own (`RemoteWorker`), out of reach of a torchrun job's process group,
with a bound on every wait for it."""

from pathlib import Path

from ggpo_offline.core.remote import RemoteWorker, serve
from ggpo_offline.evaluate.config import EvalConfig
from ggpo_offline.evaluate.eval_report import EvalReport


class RemoteEvaluator:
    """``Evaluator(config)`` run in a clean spawned process, kept across checkpoints so its engine starts
    once. Every call waits at most ``timeout_s``; a dead, failing or overdue engine process ends the call
    with a `JobFailure` line saying how it ended."""

    def __init__(self, config: EvalConfig, timeout_s: float):
        self.timeout_s = timeout_s
        self._worker = RemoteWorker("the evaluation engine", _EvaluationHandler, config, timeout_s)
        self._worker.ask(("check", None, None), "checking the evaluation benchmarks")

    @property
    def pid(self) -> int | None:
        return self._worker.pid

    def evaluate(self, model: str | Path, protocol: EvalConfig | None = None) -> EvalReport:
        """The report of ``model`` under the process's protocol, or under ``protocol`` on the same engine
        (`Evaluator.lend`); it crosses the pipe pickled, as the same `EvalReport`."""
        return self._worker.ask(("evaluate", protocol, str(model)), f"evaluating {Path(model).name}")

    def lend(self, config: EvalConfig) -> "LentRemote":
        """``config``'s protocol on this process's engine (what `Evaluator.lend` gives in-process)."""
        return LentRemote(self, config)

    def close(self) -> None:
        self._worker.close()


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


class _EvaluationHandler:
    """The evaluation process's answers: ("check" | "evaluate", protocol, model) requests."""

    def __init__(self, config: EvalConfig):
        from ggpo_offline.evaluate.evaluator import Evaluator

        self.evaluator = Evaluator(config)

    def answer(self, kind: str, protocol: EvalConfig | None, model: str | None) -> EvalReport | None:
        if kind == "check":
            return None
        if protocol is None:
            return self.evaluator.evaluate(model)
        with self.evaluator.lend(protocol) as lent:
            return lent.evaluate(model)

    def close(self) -> None:
        self.evaluator.close()


def _serve(conn, config: EvalConfig) -> None:
    """The evaluation process (`serve`) with ``config``'s evaluator."""
    serve(conn, _EvaluationHandler, config)
