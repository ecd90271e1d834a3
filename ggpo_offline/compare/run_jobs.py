"""A compare's run as a job: the `ggpo train` command its README reproduces, carried on from whatever state
its folder is in (``--resume-if-any``), or in a worker, the same call on the worker's started engine."""

import shlex
from dataclasses import dataclass

from ggpo_offline.jobs.job import JobState, OnState, Session
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.metric_names import UPDATE
from ggpo_offline.train.run_folder import RunFolder, continuing_action
from ggpo_offline.train.run_records import RunSettings


@dataclass(frozen=True)
class TrainJob:
    """One run of a compare (``config``), trained by ``nproc`` processes."""

    config: TrainConfig
    command: str
    """`run_sections.train_command`: the run's ``ggpo train`` command."""
    nproc: int = 1
    parent_run_id: str | None = None
    """The compare's MLflow run, which a run trained by a worker nests under (others are adopted later)."""

    @property
    def name(self) -> str:
        return self.config.run_name

    def argv(self) -> list[str]:
        processes = ["--nproc", str(self.nproc)] if self.nproc > 1 else []
        return [*shlex.split(self.command), *processes, "--resume-if-any"]

    def progress(self) -> str:
        metrics = RunFolder(self.config.run_dir).read_metrics()
        return f"update {metrics[-1][UPDATE] + 1}/{self.config.updates}" if metrics else ""

    def finished(self) -> bool:
        return RunFolder(self.config.run_dir).is_finished()

    def run(self, session: Session, report: OnState) -> None:
        """What ``argv`` does, in this process: the pool read and the engine started once a worker."""
        from ggpo_offline.train.pool_index import check_pool
        from ggpo_offline.train.run_inputs import plan_data

        config = self.config
        pool = session.keep(("pool", config.pool), lambda _: check_pool(config.pool))
        fingerprints = plan_data(config, pool.index, pool.fingerprint).fingerprints
        expected = RunSettings.of(config, fingerprints.to_dict())
        action = continuing_action(config.run_dir, expected, TrainConfig().to_dict())
        if action == "reuse":
            return
        resume, overwrite = action == "resume", action == "replace"
        if self.nproc > 1:
            from ggpo_offline.train.launch import launch

            launch(config, self.nproc, resume, overwrite)
            return
        from ggpo_offline.train.trainer import train

        def updated(update: int, _metrics: dict) -> None:
            report(self.name, JobState("running", f"update {update + 1}/{config.updates}"))

        train(
            config,
            resume=resume,
            overwrite=overwrite,
            on_update=updated,
            evaluator=session.keep(
                ("evaluator", config.pool, config.model, config.evaluation),
                lambda stack: self._evaluator(stack, session.engine, pool),
            ),
            parent_run_id=self.parent_run_id,
            pool=pool,
        )

    def _evaluator(self, stack, engine, pool):
        """The run's evaluation engine, started once per worker (π0's log-probs scored first: the cache every
        run on the pool reads)."""
        from ggpo_offline.evaluate.evaluator import Evaluator
        from ggpo_offline.train.evaluation import eval_config
        from ggpo_offline.train.run_inputs import read_inputs, score_pi0

        inputs = read_inputs(self.config, pool=pool)
        score_pi0(self.config, inputs)
        return stack.enter_context(Evaluator(eval_config(self.config, inputs.model_dir), engine))
