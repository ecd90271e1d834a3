"""`ggpo compare`: every method × seed on one pool, one data plan per seed, reported as tables and figures."""

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ggpo_offline import __version__
from ggpo_offline.compare.against_ceilings import CEILINGS_FILE, read_ceilings
from ggpo_offline.compare.budget import budgeted
from ggpo_offline.compare.config import LOGS_FOLDER, RUNS_FOLDER, SLURM_FOLDER, CompareConfig
from ggpo_offline.compare.counts import COUNTS_FILE
from ggpo_offline.compare.manifest import MARKER, CompareManifest, ManifestRun
from ggpo_offline.compare.report import (
    DIAGNOSTICS_FILE,
    FIGURES,
    Report,
    RunRecord,
    check_data_plans,
    load_run,
    write_report,
)
from ggpo_offline.compare.run_jobs import TrainJob
from ggpo_offline.compare.run_sections import reproduce_command, train_command, write_readme
from ggpo_offline.core.errors import UserError
from ggpo_offline.core.one_writer import WRITER_LOCK, one_writer
from ggpo_offline.core.settings import replace_settings
from ggpo_offline.generate.engines import Engine
from ggpo_offline.jobs.job import JobFailed, JobState, Launcher, OnState, Session
from ggpo_offline.jobs.local import LocalLauncher
from ggpo_offline.train.config import PER_RUN, TrainConfig
from ggpo_offline.train.dry_run import Estimate, estimate, run_folders_near
from ggpo_offline.train.learners import learner
from ggpo_offline.train.pool_index import CheckedPool, check_pool
from ggpo_offline.train.run_folder import RunFolder, continuing_action
from ggpo_offline.train.run_inputs import Fingerprints, RunInputs, plan_data, read_inputs, rounds_source
from ggpo_offline.train.run_records import RunId, RunSettings
from ggpo_offline.train.training_presets import config_for, given_settings, refuse_unread

# The train modules that load torch and transformers are imported inside the functions that train, so a
# refused command answers in a second or two instead of after ~10 s of imports.

EVALUATIONS_PER_RUN = 5
"""Without --eval-every, runs are evaluated every U/5 updates (the paper: every 80 of 400)."""


@dataclass(frozen=True)
class Verbs:
    """How an action on a run reads: while compare does it (the terminal) and once done (the README)."""

    doing: str
    done: str


ACTIONS = {
    "reuse": Verbs("reusing", "reused"),
    "resume": Verbs("resuming", "resumed"),
    "train": Verbs("training", "trained"),
    "replace": Verbs("retraining", "retrained"),
}
"""What compare can do with a run (`plan` chooses), by the name compare.json records."""


@dataclass(frozen=True)
class PlannedRun:
    """One method × seed run and what compare will do with it: one of ``ACTIONS``."""

    config: TrainConfig
    action: str
    fingerprints: Fingerprints

    @property
    def verbs(self) -> Verbs:
        return ACTIONS[self.action]


@dataclass(frozen=True)
class CompareResult:
    report_dir: Path
    records: list[RunRecord]
    data_plans: dict[int, str]
    parent_run_id: str | None
    actions: dict[str, str]
    report: Report
    """What the report folder's tables hold, as computed (the terminal prints it from here)."""


def run_configs(config: CompareConfig) -> list[TrainConfig]:
    """The TrainConfig of every run, seed-major (all methods of seed 1, then seed 2, ...).

    A learner-specific setting is refused only when none of the methods reads it; each run gets those its
    own learner reads."""
    shared = given_settings(config.config_file, config.settings)
    refuse_unread(shared, tuple(learner(method) for method in config.methods))
    runs = []
    for seed in config.seeds:
        for method in config.methods:
            per_run = {"pool": Path(config.pool), "method": method, "seed": seed}
            out = config.report_dir / RUNS_FOLDER / RunId(method, seed).folder_name
            run = config_for(config.preset, {**learner(method).keep_read(shared), **per_run, "out": out})
            if run.evaluation.eval_every is None:
                run = replace_settings(run, eval_every=max(1, run.updates // EVALUATIONS_PER_RUN))
            runs.append(run)
    return runs


def plan(config: CompareConfig, pool: CheckedPool) -> list[PlannedRun]:
    """Decide before any training what happens to each run on ``pool`` (`check_pool` of ``config.pool``);
    refuse run folders made with other settings."""
    read_ceilings(config.ceilings)
    _check_report_dir(config.report_dir)
    runs = run_configs(config)
    rounds_source(runs[0], pool)  # every run samples its rounds from the same prompts: refused here at once
    planned = []
    for run in runs:
        fingerprints = plan_data(run, pool.index, pool.fingerprint).fingerprints  # what `train` will replay
        action = _action(run, fingerprints, config.rerun)
        planned.append(PlannedRun(run, action, fingerprints))
    return planned


def _action(run: TrainConfig, fingerprints: Fingerprints, rerun: bool) -> str:
    expected = RunSettings.of(run, fingerprints.to_dict())
    return continuing_action(run.run_dir, expected, TrainConfig().to_dict(), rerun=rerun)


def _check_report_dir(report_dir: Path) -> None:
    """Never write into a folder of the user's that is not a comparison report."""
    if report_dir.is_file():
        raise UserError(f"--out {report_dir} is a file; give a folder")
    held_only = {WRITER_LOCK}  # a compare just started there: its own lock, refused with its own line
    if (
        report_dir.is_dir()
        and {p.name for p in report_dir.iterdir()} - held_only
        and not (report_dir / MARKER).is_file()
    ):
        raise UserError(
            f"--out {report_dir} is not empty and holds no comparison report; choose another folder"
        )


@dataclass(frozen=True)
class ComparePlan:
    """A compare as it will run (`plan_compare`): what `--dry-run` prints and the real run executes."""

    config: CompareConfig
    """With the seeds and evaluation sizes a --budget bought."""
    pool: CheckedPool
    """Read once: every run trains on what this read."""
    runs: list[PlannedRun]
    inputs: RunInputs
    """What every run reads: the initial model's folder and tokenizer, checked against the pool."""
    launcher: Launcher
    """Where the runs' jobs run, checked (cores, GPUs, a reachable controller and partition)."""

    def estimate(self) -> Estimate:
        """The runs to train (not reused), timed from earlier runs of their shape (`dry_run.estimate`)."""
        first = self.runs[0].config
        to_train = sum(run.action != "reuse" for run in self.runs)
        return estimate(first, to_train, run_folders_near(first.run_dir))

    def jobs(self, parent_run_id: str | None = None) -> list[TrainJob]:
        """A job for every run not reused, in plan order: its ``ggpo train`` command."""
        return [
            TrainJob(run.config, train_command(run.config, self.config), self.config.nproc, parent_run_id)
            for run in self.runs
            if run.action != "reuse"
        ]


def plan_compare(config: CompareConfig, engine: Engine | None = None) -> ComparePlan:
    """Every check compare makes before it writes anything: the budget, the pool, each run's settings,
    data plan and folder (`plan`), the tokenizer and sampling every run reads (`read_inputs`), and where the
    runs will run (`launcher_for`; ``engine``: one lent to the runs trained in this process). Loads no
    model."""
    config, _ = budgeted(config)
    pool = check_pool(config.pool)
    planned = plan(config, pool)
    inputs = read_inputs(planned[0].config, pool=pool)
    return ComparePlan(config, pool, planned, inputs, launcher_for(config, pool, engine))


@dataclass(frozen=True)
class Submitted:
    """A compare that returned once its jobs were submitted (``--no-wait``): the same command collects."""

    report_dir: Path
    jobs: int
    command: str


def compare(
    config: CompareConfig, *, report: OnState | None = None, engine: Engine | None = None
) -> CompareResult | Submitted:
    """Train (or reuse) every run, each a job of the launcher's, check the data plans, and write the report
    into ``config.report_dir``; one compare at a time on a report folder.

    ``report`` is told of each job's state; ``engine`` lends an already started generation engine holding
    the pool's model to the evaluations of runs trained in this process.
    """
    ready = plan_compare(config, engine)  # every refusal comes before the first write
    with one_writer(ready.config.report_dir, rule="a report folder has one compare", then="run it again"):
        return _compare(ready, report or (lambda name, state: None))


def _compare(ready: ComparePlan, report: OnState) -> CompareResult | Submitted:
    from ggpo_offline.core import tracking

    config, planned = ready.config, ready.runs
    shared, report_dir = planned[0].config, config.report_dir
    _write_marker(report_dir, config, planned, status="running")
    if not shared.no_tracking:
        tracking.check_tracking_reachable(shared.tracking_uri or tracking.default_tracking_uri())
    parent = tracking.start_tracking(
        experiment=shared.experiment or Path(config.pool).stem,
        run_name=f"compare-{Path(config.pool).stem}",
        tracking_uri=shared.tracking_uri,
        enabled=not shared.no_tracking,
    )
    with tracking.ending(parent):
        parent.log_params({"methods": ",".join(config.methods), "seeds": ",".join(map(str, config.seeds))})
        parent.log_params({k: v for k, v in shared.to_dict().items() if k not in PER_RUN})
        _clear_replaced(ready.runs, config.rerun)
        for run in planned:
            if run.action == "reuse":
                report(run.config.run_name, JobState("done", "reused"))
        jobs = ready.jobs(parent.run_id)
        try:
            ended = ready.launcher.run(jobs, report)
        except JobFailed as failed:
            log = f"; its log: {failed.log}" if failed.log is not None else ""
            raise UserError(
                f"run {failed.name} failed: {failed.why}{log}; the same command continues: "
                f"{reproduce_command(config, launch=True)}"
            ) from None
        if not ended:
            return Submitted(report_dir, len(jobs), reproduce_command(config, launch=True))
        records = [load_run(run.config.run_dir, run.config.method, run.config.seed) for run in planned]
        data_plans = check_data_plans(records)
        if parent.run_id is not None:
            _adopt_children(shared, parent.run_id, records)
        ceilings = read_ceilings(config.ceilings)
        report_data = write_report(records, list(config.methods), list(config.seeds), report_dir, ceilings)
        write_readme(config, ready.pool, planned, records, data_plans, parent.run_id, report_data)
        _write_marker(report_dir, config, planned, status="finished", data_plans=data_plans)
        written = ("table.md", "table.csv", COUNTS_FILE, DIAGNOSTICS_FILE, "README.md", MARKER, *FIGURES)
        for name in (*written, CEILINGS_FILE) if report_data.ceilings else written:
            parent.log_artifact(report_dir / name, "report")
        parent.set_tags({f"data_order_fingerprint.seed{s}": f for s, f in data_plans.items()})
    actions = {run.config.run_name: run.action for run in planned}
    return CompareResult(report_dir, records, data_plans, parent.run_id, actions, report_data)


def _clear_replaced(runs: list[PlannedRun], rerun: bool) -> None:
    """Empty the folders of the runs --rerun replaces: their jobs then train them from the start (and a
    requeued one resumes). A run stopped before its first checkpoint is its job's to start again
    (--resume-if-any): its Slurm task may still be writing it while a later compare follows it."""
    if not rerun:
        return
    for run in runs:
        if run.action == "replace" and run.config.run_dir.exists():
            with one_writer(run.config.run_dir):
                RunFolder(run.config.run_dir).clear()


def launcher_for(config: CompareConfig, pool: CheckedPool, engine: Engine | None = None) -> Launcher:
    """The launcher of ``config``'s runs, checked (cores, GPUs, a reachable controller) before any write.
    Runs trained in this process share ``pool`` as read and ``engine``."""
    if config.launch.launcher == "slurm":
        from ggpo_offline.jobs.slurm import SlurmLauncher

        return SlurmLauncher(config.launch, config.report_dir / SLURM_FOLDER, config.nproc)
    here = Session(engine)
    here.lend(("pool", pool.path), pool)
    return LocalLauncher(config.jobs, config.nproc, config.report_dir / LOGS_FOLDER, here)


def _adopt_children(shared: TrainConfig, parent_run_id: str, records: list[RunRecord]) -> None:
    """Reused runs belong to an earlier comparison's parent; nest those of this store under this one."""
    from ggpo_offline.core import tracking

    store = shared.tracking_uri or tracking.default_tracking_uri()
    for record in records:
        run_id, uri = record.result.run_id, record.result.tracking_uri
        if run_id is not None and uri == store:
            tracking.set_parent(uri, run_id, parent_run_id)


def _write_marker(report_dir: Path, config: CompareConfig, planned, status: str, data_plans=None) -> None:
    CompareManifest(
        status=status,
        tool_version=__version__,
        updated=datetime.now(UTC).isoformat(timespec="seconds"),
        command=reproduce_command(config),
        pool=str(config.pool),
        methods=tuple(config.methods),
        seeds=tuple(config.seeds),
        runs={r.config.run_name: ManifestRun(str(r.config.run_dir), r.action) for r in planned},
        data_order_fingerprints={str(s): f for s, f in (data_plans or {}).items()},
    ).write(report_dir)
