"""`ggpo generate-pool --launcher slurm --num-shards K`: the K shards as the jobs of one Slurm array, each the
`ggpo generate-pool --shard-index i` command a user would type, then validated and merged into --out."""

import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.settings import replace_settings, to_flags
from ggpo_offline.generate.config import GenerateConfig
from ggpo_offline.jobs.config import LaunchConfig
from ggpo_offline.jobs.job import JobFailed, OnState, Session
from ggpo_offline.pool.partial import prompts_stored
from ggpo_offline.pool.writer import check_output_path

SLURM_FOLDER = "slurm"
"""Inside the shard folder: the tasks' logs and the ids submitted (jobs.json)."""


def shard_folder(out: Path) -> Path:
    """``pools/.big.parquet.shards/`` beside ``pools/big.parquet``: hidden like the partial runs, and
    removed once the merged pool is in place."""
    return Path(out).with_name(f".{Path(out).name}.shards")


@dataclass(frozen=True)
class ShardJob:
    """One shard of a sharded generate-pool: its own settings (``--shard-index i``, its shard file as
    ``--out``, run where the task runs)."""

    config: GenerateConfig

    @property
    def name(self) -> str:
        return f"shard-{self.config.shard_index}"

    def argv(self) -> list[str]:
        return ["ggpo", "generate-pool", *to_flags(self.config, GenerateConfig)]

    def progress(self) -> str:
        stored = prompts_stored(self.config.out)
        return f"{stored} prompts stored" if stored is not None else ""

    def finished(self) -> bool:
        return self.config.out.is_file()

    def run(self, session: Session, report: OnState) -> None:
        from ggpo_offline.generate.pipeline import generate_pool

        generate_pool(self.config)


def shard_jobs(config: GenerateConfig) -> list[ShardJob]:
    """A job for each of ``config``'s shards, written into its shard folder as ``shard-<i>.parquet``."""
    folder = shard_folder(config.out)
    return [
        ShardJob(
            replace_settings(config, shard_index=index, out=folder / f"shard-{index}.parquet", **_here())
        )
        for index in range(config.num_shards)
    ]


def _here() -> dict:
    """The launch settings of a task's own command: it generates its shard where it runs."""
    defaults = LaunchConfig()
    return {"launcher": defaults.launcher, "no_wait": defaults.no_wait, **vars(defaults.slurm)}


@dataclass(frozen=True)
class ShardsSubmitted:
    """A sharded generate-pool that returned once its shards were submitted (``--no-wait``)."""

    out: Path
    jobs: int
    command: str


def generate_on_slurm(config: GenerateConfig, report: OnState) -> Path | ShardsSubmitted:
    """Generate ``config``'s shards as one Slurm job array (each task resumable: a requeued one carries on
    from its last stored batch; a shard already written is not generated again), then validate and merge
    them into ``config.out``. Every refusal (settings, an existing pool, Slurm itself) comes before the first
    write; a failed task raises one line naming its log and the command that continues."""
    from ggpo_offline.jobs.slurm import SlurmLauncher
    from ggpo_offline.pool.merge import merge_pool

    out = Path(config.out)
    check_output_path(out, config.overwrite)
    folder = shard_folder(out)
    launcher = SlurmLauncher(config.launch, folder / SLURM_FOLDER)
    jobs = shard_jobs(config)
    command = shlex.join(["ggpo", "generate-pool", *to_flags(config, GenerateConfig)])
    stale = _stale_shards(jobs)
    if stale and not config.overwrite:
        raise UserError(
            f"{next(iter(stale.values()))}; pass --overwrite to generate it again, or delete {folder}"
        )
    for shard in stale:
        shard.unlink()
    try:
        ended = launcher.run(jobs, report)  # one command at a time follows the folder's jobs
    except JobFailed as failed:
        log = f"; its log: {failed.log}" if failed.log is not None else ""
        raise UserError(
            f"{failed.name} failed: {failed.why}{log}; the same command continues: {command}"
        ) from None
    if not ended:
        return ShardsSubmitted(out, len(jobs), command)
    merged = merge_pool(folder, out, config.overwrite)
    shutil.rmtree(folder)  # the merged pool holds every row and the shards' merged footer
    return merged


def _stale_shards(jobs: list[ShardJob]) -> dict[Path, str]:
    """Each shard file already written with other settings than its job's (an earlier command's), with a
    line saying so: merged with the others, it would make another pool than the one asked for."""
    from ggpo_offline.generate.pipeline import recorded_settings
    from ggpo_offline.pool.source import read_pool_info

    stale = {}
    for job in jobs:
        if not job.finished():
            continue
        info = read_pool_info(job.config.out)
        sampling = job.config.sampling.as_dict()
        written = {**(info.config or {}), **{key: info.raw["sampling"].get(key) for key in sampling}}
        wanted = {
            key: _as_stored(value) for key, value in {**recorded_settings(job.config), **sampling}.items()
        }
        differing = sorted(
            key for key in wanted.keys() | written.keys() if wanted.get(key) != written.get(key)
        )
        if differing:
            stale[job.config.out] = (
                f"{job.config.out} was written with other settings ({', '.join(differing)})"
            )
    return stale


def _as_stored(value):
    """A setting's value as the pool's JSON footer gives it back."""
    if isinstance(value, Path):
        return str(value)
    return list(value) if isinstance(value, tuple) else value
