"""`ggpo compare`: every method × seed on one pool, one data plan per seed, reported as tables and figures."""

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from ggpo_offline import __version__
from ggpo_offline.compare.budget import budgeted
from ggpo_offline.compare.ceilings import CEILINGS_FILE, read_ceilings
from ggpo_offline.compare.comparison_readme import reproduce_command, write_readme
from ggpo_offline.compare.config import RUNS_FOLDER, CompareConfig
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
from ggpo_offline.compare.sharing import REPORT_CLAIM, claim, take_turns
from ggpo_offline.core.errors import UserError
from ggpo_offline.core.settings import replace_settings
from ggpo_offline.evaluate.evaluator import Evaluator
from ggpo_offline.evaluate.report import EvalReport
from ggpo_offline.generate.engines import Engine
from ggpo_offline.train.config import PER_RUN, TrainConfig
from ggpo_offline.train.dry_run import Estimate, estimate, run_folders_near
from ggpo_offline.train.learners import learner
from ggpo_offline.train.pool_index import CheckedPool, check_pool
from ggpo_offline.train.run_folder import RunFolder
from ggpo_offline.train.run_inputs import Fingerprints, RunInputs, plan_data, read_inputs, score_pi0
from ggpo_offline.train.run_records import RunId, RunResult, RunSettings
from ggpo_offline.train.training_presets import config_for, given_settings, refuse_unread

# The train modules that load torch and transformers are imported inside the functions that train, so a
# refused command answers in a second or two instead of after ~10 s of imports.

EVALUATIONS_PER_RUN = 5
"""Without --eval-every, runs are evaluated every U/5 updates (the paper: every 80 of 400)."""
TRACKING_SETTINGS = ("tracking_uri", "experiment", "no_tracking")


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
    finished_stamp: int | None = None
    """When `plan` looked: the run's result file's mtime in ns (None: not finished). A run another compare
    finished since then has another."""

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
    planned = []
    for run in runs:
        fingerprints = plan_data(run, pool.index, pool.fingerprint).fingerprints  # what `train` will replay
        action = _action(run, fingerprints, config.rerun)
        planned.append(PlannedRun(run, action, fingerprints, RunResult.finished_stamp(run.run_dir)))
    return planned


def _now(run: PlannedRun) -> PlannedRun:
    """What to do with ``run`` now that this compare holds its claim (`sharing`): reuse it when another
    compare side by side finished it since `plan` looked; else as planned, or, where another compare left
    it unfinished, resume or replace it as `plan` would."""
    finished = RunResult.finished_stamp(run.config.run_dir)
    if finished is not None and finished != run.finished_stamp:
        return replace(run, action="reuse")
    if run.action == "replace" or (run.action == "reuse" and finished is not None):
        return run
    return replace(run, action=_action(run.config, run.fingerprints, rerun=False))


def _action(run: TrainConfig, fingerprints: Fingerprints, rerun: bool) -> str:
    folder = RunFolder(run.run_dir)
    if folder.is_empty():
        return "train"
    if rerun:
        return "replace"
    differing = _differences(folder.read_settings(), RunSettings.of(run, fingerprints.to_dict()))
    if differing:
        raise UserError(
            f"{folder.path} holds a run with other settings or another pool ({differing}); pass --rerun to "
            "replace it or --out to report elsewhere"
        )
    if folder.is_finished():
        return "reuse"
    return "resume" if folder.latest_checkpoint() is not None else "replace"


def _differences(saved_run: RunSettings, expected_run: RunSettings) -> str:
    """The settings in which a saved run differs from the one wanted, as ``name: saved -> wanted``.

    Where a run was logged does not change its results, and a setting the run predates counts as
    matching when the wanted value is that setting's default (the run behaved as the default does).
    """
    defaults, saved, expected = TrainConfig().to_dict(), saved_run.values, expected_run.values
    missing = object()
    differing = []
    for key in sorted(set(saved) | set(expected)):
        old, new = saved.get(key, missing), expected.get(key, missing)
        if key in TRACKING_SETTINGS or old == new:
            continue
        if old is missing and key in defaults and new == defaults[key]:
            continue
        differing.append(
            f"{key}: {'unset' if old is missing else old} -> {'unset' if new is missing else new}"
        )
    return ", ".join(differing)


def _check_report_dir(report_dir: Path) -> None:
    """Never write into a folder of the user's that is not a comparison report."""
    if report_dir.is_file():
        raise UserError(f"--out {report_dir} is a file; give a folder")
    if report_dir.is_dir() and any(report_dir.iterdir()) and not (report_dir / MARKER).is_file():
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

    def estimate(self) -> Estimate:
        """The runs to train (not reused), timed from earlier runs of their shape (`dry_run.estimate`)."""
        first = self.runs[0].config
        to_train = sum(run.action != "reuse" for run in self.runs)
        return estimate(first, to_train, run_folders_near(first.run_dir))


def plan_compare(config: CompareConfig) -> ComparePlan:
    """Every check compare makes before it writes anything: the budget, the pool, each run's settings,
    data plan and folder (`plan`), and the tokenizer and sampling every run reads (`read_inputs`). Loads no
    model."""
    config, _ = budgeted(config)
    pool = check_pool(config.pool)
    planned = plan(config, pool)
    return ComparePlan(config, pool, planned, read_inputs(planned[0].config, pool=pool))


def compare(
    config: CompareConfig,
    *,
    on_run: Callable[[int, int, PlannedRun], None] | None = None,
    on_update: Callable[[int, dict], None] | None = None,
    on_eval: Callable[[int, EvalReport], None] | None = None,
    engine: Engine | None = None,
) -> CompareResult:
    """Train (or reuse) every run, check the data plans, and write the report into ``config.report_dir``.

    ``engine`` lends an already started generation engine holding the pool's model to the evaluations.
    """
    ready = plan_compare(config)  # every refusal comes before the first write
    config, planned = ready.config, ready.runs
    from ggpo_offline.core import tracking

    shared = planned[0].config
    report_dir = config.report_dir
    report_dir.mkdir(parents=True, exist_ok=True)
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
        done = _train_or_reuse(ready, report_dir, engine, parent.run_id, on_run, on_update, on_eval)
        records = [load_run(run.config.run_dir, run.config.method, run.config.seed) for run in done]
        data_plans = check_data_plans(records)
        if parent.run_id is not None:
            _adopt_children(shared, parent.run_id, records)
        ceilings = read_ceilings(config.ceilings)
        with claim(report_dir, REPORT_CLAIM):  # compares side by side write it one after the other
            report = write_report(records, list(config.methods), list(config.seeds), report_dir, ceilings)
            write_readme(config, done, records, data_plans, parent.run_id, report)
            _write_marker(report_dir, config, done, status="finished", data_plans=data_plans)
            written = ("table.md", "table.csv", COUNTS_FILE, DIAGNOSTICS_FILE, "README.md", MARKER, *FIGURES)
            for name in (*written, CEILINGS_FILE) if report.ceilings else written:
                parent.log_artifact(report_dir / name, "report")
        parent.set_tags({f"data_order_fingerprint.seed{s}": f for s, f in data_plans.items()})
    actions = {run.config.run_name: run.action for run in done}
    return CompareResult(report_dir, records, data_plans, parent.run_id, actions, report)


def _train_or_reuse(
    ready: ComparePlan, report_dir: Path, engine, parent_run_id, on_run, on_update, on_eval
) -> list[PlannedRun]:
    """Train or reuse every run, each under its claim (`take_turns`): what this compare did with each. π0's
    log-probs once for every run (GRPO's fixed reference, GGPO/AGRO's first one) and one engine and
    evaluation protocol (the base model evaluated once), both only once a run is trained here."""
    from ggpo_offline.train.evaluation import eval_config

    shared, done = ready.runs[0].config, list(ready.runs)
    with ExitStack() as evaluators:
        evaluator = None
        for position, run in take_turns(ready.runs, report_dir, lambda run: run.config.run_name):
            done[position] = run = _now(run)
            if on_run is not None:
                on_run(position, len(done), run)
            if run.action == "reuse":
                continue
            if evaluator is None:
                score_pi0(shared, ready.inputs)
                evaluator = evaluators.enter_context(
                    Evaluator(eval_config(shared, ready.inputs.model_dir), engine)
                )
            _execute(run, ready.pool, evaluator, parent_run_id, on_update, on_eval)
    return done


def _execute(run: PlannedRun, pool: CheckedPool, evaluator, parent_run_id, on_update, on_eval) -> None:
    from ggpo_offline.train.trainer import train

    train(
        run.config,
        resume=run.action == "resume",
        overwrite=run.action == "replace",
        on_update=on_update,
        on_eval=on_eval,
        evaluator=evaluator,
        parent_run_id=parent_run_id,
        pool=pool,
    )


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
