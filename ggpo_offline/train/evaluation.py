"""Evaluation during training, a hook at checkpoints: when it runs, which protocol it uses, where its
reports go and how its scores are named."""

from collections.abc import Callable
from pathlib import Path

from ggpo_offline.core.errors import write_json
from ggpo_offline.evaluate.config import EvalConfig
from ggpo_offline.evaluate.eval_report import EvalReport
from ggpo_offline.evaluate.evaluator import Evaluator
from ggpo_offline.evaluate.remote_evaluator import RemoteEvaluator
from ggpo_offline.train.config import DEFAULT_TIMEOUTS, Timeouts, TrainConfig
from ggpo_offline.train.distributed import SINGLE_PROCESS, Ranks, doing, wait_for_main
from ggpo_offline.train.metric_names import GENERATED_PREFIX
from ggpo_offline.train.profile import RunProfile
from ggpo_offline.train.run_folder import RunFolder
from ggpo_offline.train.run_records import best_update


def eval_config(config: TrainConfig, initial_model: Path, test: bool = False) -> EvalConfig:
    """``ggpo eval``'s protocol for this run: the run's validation (or, with ``test``, test) benchmarks and
    seed, the pool's sampling and dtype, starting from the run's initial model."""
    return config.evaluation.protocol(initial_model, Path(config.pool), test)


def eval_due(config: TrainConfig, update: int) -> bool:
    """Update 0 (the initial model), every ``eval_every`` updates, and the final update."""
    if config.evaluation.eval_every is None:
        return False
    return update % config.evaluation.eval_every == 0 or update == config.updates


def selected_update(evals: dict[int, EvalReport]) -> int:
    """The checkpoint a run reports: `best_update` of its validation suite mean@n."""
    return best_update({update: report.suite.mean_at_n for update, report in evals.items()})


def eval_metrics(report: EvalReport) -> dict[str, float]:
    """``eval/<benchmark>/mean_at_<n>`` and ``eval/<benchmark>/pass_at_<k>``, plus ``eval/suite/...``, and
    the generated text's diagnostics as ``eval/generated/<name>`` (`GENERATED_PREFIX`).

    MLflow metric names cannot contain ``@``, hence ``mean_at_32`` for mean@32.
    """
    metrics = {}
    for scope, scores in {**report.benchmarks, "suite": report.suite}.items():
        metrics[f"eval/{scope}/mean_at_{report.n}"] = scores.mean_at_n
        for k in report.ks:
            metrics[f"eval/{scope}/pass_at_{k}"] = scores.pass_at_k[k]
    for name, value in (report.generated or {}).items():
        if value is not None:
            metrics[f"{GENERATED_PREFIX}{name}"] = value
    return metrics


class CheckpointEvaluations:
    """Evaluates a run at its due updates (`eval_due`) from the weights saved at that update: rank 0 runs
    the evaluation, writes its report into the run folder and returns its scores; the other ranks wait
    (at most ``timeouts.solo``).

    ``evaluator`` shares one (started engine, protocol) between runs; by default, when evaluation is on,
    this builds its own (which checks the benchmarks at once) and closes it at the end. Under torchrun it
    runs in a process of its own (`RemoteEvaluator`): an engine started inside a worker would join the
    training job's process group and wait forever for the other ranks.
    """

    def __init__(
        self,
        config: TrainConfig,
        initial_model: Path,
        ranks: Ranks = SINGLE_PROCESS,
        evaluator: Evaluator | None = None,
        on_eval: Callable[[int, EvalReport], None] | None = None,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        profile: RunProfile | None = None,
    ):
        self.config, self.initial_model, self.ranks, self.on_eval = config, initial_model, ranks, on_eval
        self.profile = RunProfile() if profile is None else profile
        self.owned = evaluator is None and config.evaluation.eval_every is not None and ranks.main
        self.evaluator = evaluator
        if self.owned:
            protocol = eval_config(config, initial_model)
            self.evaluator = (
                RemoteEvaluator(protocol, timeouts.solo) if ranks.distributed else Evaluator(protocol)
            )

    def due(self, update: int) -> bool:
        return eval_due(self.config, update)

    def at(self, update: int, folder: RunFolder, drift: Callable[[], dict[str, float]]) -> dict[str, float]:
        """The scores of update ``update`` and the policy's drift from π0, measured by ``drift`` (every rank
        calls it; `Trainer.drift`), or {} when no evaluation is due; its checkpoint must be saved, and the
        policy must be that checkpoint's."""
        if not self.due(update):
            return {}
        metrics = drift()
        waiting = f"waiting for the evaluation of update {update}"
        doing(f"evaluating update {update}" if self.ranks.main else waiting)
        with self.profile.phase("evaluate", update):
            if self.ranks.main:
                weights = self.initial_model if update == 0 else folder.checkpoint(update)
                report = self.evaluator.evaluate(weights)
                write_json(report.to_dict(), folder.eval_report(update))
                if self.on_eval is not None:
                    self.on_eval(update, report)
                metrics |= eval_metrics(report)
            wait_for_main(self.ranks)
        return metrics

    def test(self, folder: RunFolder) -> int | None:
        """After the last update: evaluate the test benchmarks once, on the selected checkpoint
        (`selected_update` over the validation reports in ``folder``), the final one and the initial model
        (each run's base, for gains); returns the
        selected update (None when evaluation is off). Test scores go to their own reports only, never into
        what selection reads."""
        if self.config.evaluation.eval_every is None:
            return None
        selected = selected_update(folder.read_evals()) if self.ranks.main else None
        if not self.config.evaluation.test_datasets or self.config.evaluation.no_test:
            return selected
        doing("evaluating the test split" if self.ranks.main else "waiting for the test evaluation")
        with self.profile.phase("test"):
            if self.ranks.main:
                # The test protocol borrows the running engine: starting another costs more than evaluating.
                with self.evaluator.lend(eval_config(self.config, self.initial_model, test=True)) as test:
                    for update in sorted({0, selected, self.config.updates}):
                        weights = self.initial_model if update == 0 else folder.checkpoint(update)
                        write_json(test.evaluate(weights).to_dict(), folder.test_report(update))
            wait_for_main(self.ranks)
        return selected

    def close(self) -> None:
        if self.owned:
            self.evaluator.close()

    def __enter__(self) -> "CheckpointEvaluations":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
