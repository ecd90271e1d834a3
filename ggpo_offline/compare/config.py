"""The settings of `ggpo compare` and `ggpo arc-report`: which runs on which pool, written where; each refuses
a plan that cannot run where it is built."""

from dataclasses import dataclass, field
from pathlib import Path

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.settings import above, at_least, check_settings, normalize, setting, value_problem
from ggpo_offline.generate.engines.base import EngineName
from ggpo_offline.jobs.config import LaunchConfig
from ggpo_offline.train.config import PER_RUN, Preset, TrainConfig
from ggpo_offline.train.learners import learner

DEFAULT_METHODS = ("grpo", "grpo-tis", "agro", "ggpo")
DEFAULT_SEEDS = (42, 1234, 2027)
RUNS_FOLDER = "runs"
"""Where a compare keeps its runs, inside the report folder: runs/<method>-s<seed>/."""
LOGS_FOLDER = "logs"
"""Inside the report folder: each run's output when a worker process trains it (logs/<run>.log)."""
SLURM_FOLDER = "slurm"
"""Inside the report folder: the Slurm jobs submitted (their ids) and their logs."""


CEILINGS_HELP = (
    "`ggpo measure-styles --json` report of the pool's model: adds how each method ends against its "
    "ceilings of selection, per prompt class (arith test problems)."
)


def check_methods_and_seeds(methods: tuple[str, ...], seeds: tuple[int, ...]) -> None:
    """Refuse an unknown learner, an empty list or one that names a method or seed twice, with one line."""
    for method in methods:
        learner(method)  # UnknownMethod names the choices
    if not methods or not seeds:
        raise UserError("give at least one method and one seed")
    for name, values in (("method", methods), ("seed", seeds)):
        if len(set(values)) != len(values):
            raise UserError(f"a {name} is listed twice")


@dataclass(frozen=True)
class CompareConfig:
    """What ``ggpo compare`` runs and where it writes."""

    pool: Path = setting(Path("pools/base.parquet"), "Pool every run replays.")
    methods: tuple[str, ...] = setting(DEFAULT_METHODS, "Comma-separated learners.")
    seeds: tuple[int, ...] = setting(DEFAULT_SEEDS, "Comma-separated training seeds.", valid=at_least(0))
    preset: Preset | None = setting(None, "Training preset of every run: paper-offline, tiny or arc.")
    config_file: Path | None = setting(
        None, "TOML/YAML/JSON file of training settings shared by all runs.", flag="config"
    )
    ceilings: Path | None = setting(None, CEILINGS_HELP)
    settings: dict = field(default_factory=dict)
    """Training settings shared by every run, by TrainConfig field name (``ggpo compare``'s train flags)."""
    out: Path | None = setting(None, "Report folder [default: reports/<pool name>/].")
    rerun: bool = setting(False, "Train every run again instead of reusing it.")
    budget: float | None = setting(
        None,
        "Core-minutes to spend (the runs' times on one core, summed): choose the seeds (--seeds first, then "
        "1, 2, ...) and the evaluation problems and samples not given that detect the smallest difference, "
        "projected from --budget-from.",
        valid=above(0),
    )
    budget_from: Path | None = setting(
        None, "A previous compare's report folder: its validation variance split and its runs' times."
    )
    dry_run: bool = setting(
        False,
        "Print the plan (runs to train or reuse, data per seed, evaluations, the jobs and their commands, a "
        "time estimate) after every check the real run makes, and exit; writes nothing.",
    )
    jobs: int = setting(
        1,
        "local: runs trained at once, each by a worker pinned to its share of the cores (and of the GPUs: "
        "--nproc each) that keeps its engine from one run to the next.",
        valid=at_least(1),
    )
    nproc: int = setting(
        1, "Processes per run (torchrun: DDP, or FSDP2 with --fsdp), on one node.", valid=at_least(1)
    )
    launch: LaunchConfig = setting(default_factory=LaunchConfig)
    """Where the runs run (its fields are this config's settings: ``launcher``, ``partition``, ...)."""

    def __post_init__(self) -> None:
        check_settings(self)
        self._check_budget()
        if self.jobs > 1 and self.launch.launcher == "slurm":
            raise UserError("--jobs is for --launcher local: on Slurm every run is a task of its own")
        check_methods_and_seeds(self.methods, self.seeds)
        chosen = [key for key in PER_RUN if key in self.settings]
        if chosen:
            raise UserError(f"compare chooses {', '.join(chosen)} for each run; remove it from the settings")
        for name, value in normalize(TrainConfig, self.settings, "the training settings").items():
            problem = value_problem(TrainConfig, name, value)
            if problem is not None:
                raise UserError(problem)

    def _check_budget(self) -> None:
        """A budget is spent by projecting an earlier compare (`budgeted`): the two come together."""
        if self.budget is None:
            if self.budget_from is not None:
                raise UserError("--budget-from needs --budget (core-minutes to spend)")
            return
        if self.budget_from is None:
            raise UserError(
                "--budget needs --budget-from, a compare report whose variance and times it projects"
            )

    @property
    def report_dir(self) -> Path:
        return self.out if self.out is not None else Path("reports") / Path(self.pool).stem


@dataclass(frozen=True)
class ArcConfig:
    """What ``ggpo arc-report`` reads and where it writes."""

    methods: tuple[str, ...] = setting(help="Comma-separated learners of the arc, in the report's order.")
    parts: tuple[str, ...] = setting(help="Comma-separated compare report folders holding the runs.")
    seeds: tuple[int, ...] = setting(DEFAULT_SEEDS, "Comma-separated training seeds.", valid=at_least(0))
    ablations: Path | None = setting(
        None, "Folder of compare reports, one per ablation setting, each beside the default runs."
    )
    ceilings: Path | None = setting(None, CEILINGS_HELP)
    styles_seed: int = setting(
        42, "Seed whose runs are measured with measure-styles along the arc.", valid=at_least(0)
    )
    styles_problems: int = setting(
        128, "Validation problems of each measure-styles (x 8 samples).", valid=at_least(1)
    )
    styles_engine: EngineName = setting(
        "vllm", "Engine that samples the style measures: one engine serves every checkpoint (hf: generate)."
    )
    out: Path = setting(Path("reports/arc"), "Report folder.")

    def __post_init__(self) -> None:
        check_settings(self)
        check_methods_and_seeds(self.methods, self.seeds)
        if self.styles_seed not in self.seeds:  # else no run to measure, and styles_along has no records
            raise UserError(
                f"--styles-seed {self.styles_seed} is not one of --seeds {','.join(map(str, self.seeds))}"
            )


@dataclass(frozen=True)
class LadderConfig:
    """What ``ggpo ladder-report`` reads and where it writes."""

    offline: Path = setting(
        help="Report folder of the offline compare (no --sync-every): the ladder's N = U."
    )
    rungs: tuple[str, ...] = setting(
        help="Comma-separated report folders of compares with --sync-every, each at its own N, with the same "
        "pool, seeds and evaluation as --offline."
    )
    out: Path = setting(Path("reports/ladder"), "Report folder.")

    def __post_init__(self) -> None:
        check_settings(self)


@dataclass(frozen=True)
class RegimesConfig:
    """What ``ggpo regimes-report`` reads and where it writes."""

    conditions: tuple[str, ...] = setting(
        help="Comma-separated NAME=FOLDER items: each condition's compare report folder (a mismatch dose, a "
        "lag, both, the control), with the same methods' baseline, seeds and evaluation."
    )
    baseline: str = setting("grpo", "The method without a correction that every other is set against.")
    out: Path = setting(Path("reports/regimes"), "Report folder.")

    def __post_init__(self) -> None:
        check_settings(self)


@dataclass(frozen=True)
class TuneConfig:
    """What ``ggpo tune-report`` reads and where it writes."""

    parts: tuple[str, ...] = setting(
        help="Comma-separated compare report folders, each learner at one learning rate in each; every"
        " learner and rate with the same seeds."
    )
    out: Path = setting(Path("reports/tuning"), "Report folder.")

    def __post_init__(self) -> None:
        check_settings(self)


@dataclass(frozen=True)
class RefreshConfig:
    """What ``ggpo report`` recomputes."""

    folder: Path = setting(help="Report folder written by ggpo compare, arc-report or tune-report.")
    ceilings: Path | None = setting(None, CEILINGS_HELP + " Needed when the folder has a ceilings.md.")

    def __post_init__(self) -> None:
        check_settings(self)
