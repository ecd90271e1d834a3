"""What a run will do, worked out before it starts and without a model: `--dry-run` prints it, and the real
command checks the same plan first (so the two cannot disagree)."""

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.pool_index import CheckedPool
from ggpo_offline.train.rounds import RoundSchedule
from ggpo_offline.train.run_folder import RunFolder, continuing_action, folder_action
from ggpo_offline.train.run_inputs import RunInputs, read_inputs
from ggpo_offline.train.run_records import RunSettings

SHAPE = (
    "model", "updates", "groups_per_batch", "micro_batch_size", "forward_tokens", "threads", "fsdp",
    "eval_every", "eval_num_problems", "eval_n", "test_num_problems", "no_test", "sync_every",
)  # fmt: skip
"""The settings a run's time depends on: earlier runs that share them predict a new one's."""
REPORTS = Path("reports")
"""Where compare reports live by default: their runs are the earlier runs an estimate reads."""
RECORDED = ("process", "pi0")
"""Phases a run pays only as a process's or a pool's first: not part of what one more run costs."""


@dataclass(frozen=True)
class RunPlan:
    """One run as it will go: its settings, what happens to its folder and what the pool offers."""

    config: TrainConfig
    action: str
    """train, resume, replace (``--overwrite``) or reuse (a finished run compare keeps)."""
    inputs: RunInputs

    @property
    def groups_needed(self) -> int:
        """Of the pool: all the run's groups, or its first round's with --sync-every."""
        return RoundSchedule.of(self.config).round_updates(0) * self.config.groups_per_batch

    @property
    def mixed_groups(self) -> int:
        return len(self.inputs.pool.index.mixed_group_ids)

    def estimate(self) -> "Estimate":
        """The whole run's time from earlier runs of its shape (`estimate`)."""
        return estimate(self.config, 1, run_folders_near(self.config.run_dir))

    @property
    def evaluated(self) -> tuple[int, ...]:
        """The updates whose checkpoint is evaluated on validation (`eval_due`)."""
        from ggpo_offline.train.evaluation import eval_due  # imports torch: a refusal needs none

        return tuple(update for update in range(self.config.updates + 1) if eval_due(self.config, update))


def plan_run(
    config: TrainConfig,
    pool: CheckedPool | None = None,
    *,
    resume: bool,
    overwrite: bool,
    processes: int = 1,
    resume_if_any: bool = False,
) -> RunPlan:
    """Every check `ggpo train` makes before it writes: the pool, tokenizer, sampling and data plan
    (`read_inputs`: too few mixed groups is refused here), the split over ``processes`` and the run folder
    (`folder_action`, or `continuing_action` with ``resume_if_any``, and a resume that does not match the
    run). Loads no model."""
    from ggpo_offline.train.checkpoint import resume_point
    from ggpo_offline.train.distributed import Ranks

    ranks = Ranks(world=processes)
    inputs = read_inputs(config, ranks, pool)
    if resume_if_any:
        expected = RunSettings.of(config, inputs.fingerprints.to_dict())
        action = continuing_action(config.run_dir, expected, TrainConfig().to_dict())
        resume = action == "resume"
    else:
        action = folder_action(config.run_dir, resume=resume, overwrite=overwrite)
    if resume:
        resume_point(RunFolder(config.run_dir), config, ranks)
    return RunPlan(config, action, inputs)


def shape(settings: RunSettings) -> dict:
    return settings.only(SHAPE)


def earlier_run_seconds(config: TrainConfig, folders: Iterable[Path]) -> list[float]:
    """What each finished run among ``folders`` that shares ``config``'s SHAPE recorded in profile.jsonl,
    its process start and π0 scoring left out."""
    wanted, found = shape(RunSettings.of(config, {})), []
    for folder in dict.fromkeys(Path(f) for f in folders):
        run = RunFolder(folder)
        if not run.is_finished() or shape(run.read_settings()) != wanted:
            continue
        phases = run.read_profile()
        if phases:
            found.append(sum(p.seconds for p in phases if p.phase not in RECORDED))
    return found


def run_folders_near(out: Path) -> list[Path]:
    """The run folders an estimate may read: ``out``'s siblings and every compare report's runs under
    ``reports/``."""
    return [*(out.parent.glob("*")), *REPORTS.glob("*/runs/*")]


@dataclass(frozen=True)
class Estimate:
    """Seconds of one core for the runs to train, from earlier runs of the same shape (None: none found)."""

    runs: int
    per_run: float | None
    earlier: int

    def text(self) -> str:
        if self.runs == 0:
            return "nothing to train"
        if self.per_run is None:
            return "unknown (no finished run of this shape recorded its times)"
        total = self.runs * self.per_run
        return (
            f"~{_duration(total)} on one core: {self.runs} run(s) x {self.per_run:.0f} s, the median of"
            f" {self.earlier} earlier run(s) of the same shape"
        )


def estimate(config: TrainConfig, runs: int, folders: Iterable[Path]) -> Estimate:
    seconds = earlier_run_seconds(config, folders)
    return Estimate(runs, statistics.median(seconds) if seconds else None, len(seconds))


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def plan_lines(plan: RunPlan) -> list[str]:
    """The data and evaluations of one run (of every run of a compare), as `--dry-run` prints them."""
    config = plan.config
    pool = plan.inputs.pool
    lines = [
        f"pool: {pool.path}: {pool.index.total_groups} groups x {pool.index.group_size}, {plan.mixed_groups}"
        f" with mixed rewards",
        f"data: {RoundSchedule.of(config).round_updates(0)} updates x {config.groups_per_batch} groups = "
        f"{plan.groups_needed} mixed groups per seed, of {plan.mixed_groups} "
        f"({plan.mixed_groups - plan.groups_needed} to spare)",
    ]
    lines += _round_lines(plan)
    evaluation = config.evaluation
    if evaluation.eval_every is None:
        lines.append("evaluations: none (no --eval-every)")
    else:
        updates = ", ".join(map(str, plan.evaluated))
        lines.append(
            f"validation: updates {updates} x {_problems(evaluation.eval_num_problems)} x {evaluation.eval_n}"
            " samples"
        )
        if not evaluation.no_test:
            lines.append(
                f"test: {_problems(evaluation.test_num_problems)} x {evaluation.eval_n} samples at the"
                " initial, final and selected checkpoints"
            )
    return lines


def _problems(count: int | None) -> str:
    return "every problem" if count is None else f"{count} problems"


def _round_lines(plan: RunPlan) -> list[str]:
    """The rounds a --sync-every run samples, and what sampling them costs at the pool's own pace; or the
    recorded rounds a replay trains on."""
    config, inputs = plan.config, plan.inputs
    if inputs.recorded is not None:
        pools = ", ".join(Path(r.pool).name for r in inputs.recorded)
        return [f"rounds: {len(inputs.recorded)} recorded rounds replayed in order ({pools})"]
    if config.sync_every is None:
        return []
    source, n, schedule = inputs.prompt_source, config.sync_every, RoundSchedule.of(config)
    rounds = len(schedule.starts)
    if source is None:
        return [f"rounds: 1 (--sync-every {n} covers all {config.updates} updates: the offline run)"]
    groups = n * config.groups_per_batch
    needed, sampled = source.prompts_needed(groups), source.prompts_sampled(groups)
    counts, seconds = inputs.info.counts, inputs.info.generation_seconds
    pace = "at an unknown pace (the pool records no generation time)"
    if seconds and counts.prompts:
        pace = f"~{_duration((rounds - 1) * sampled * seconds / counts.prompts)} in all at the pool's pace"
    samplers = ", ".join(str(schedule.version(index)) for index in range(1, min(rounds, 3)))
    lag = ""
    if k := config.off_policy_steps:
        lag = (
            f", {k} update{'s' if k > 1 else ''} before each round starts (asynchronous; round 0 serves "
            f"updates 0..{schedule.starts[1] - 1})"
        )
    return [
        f"rounds: {rounds} of {n} update{'s' if n > 1 else ''}; round 0 is the pool, rounds 1..{rounds - 1} "
        f"are sampled by the checkpoints of updates {samplers}{', ...' if rounds > 3 else ''}{lag}",
        f"sampling: {groups} mixed groups a round from {source.dataset} (prompt {source.next_prompt} on), "
        f"about {needed} prompts each at the pool's mixed rate {source.mixed_rate:.0%}, {sampled} sampled "
        f"(the engine's batches and its window), {pace}; {config.behavior_logprobs} behavior log-probs",
    ]
