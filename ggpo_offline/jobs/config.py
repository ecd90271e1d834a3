"""Where a command's jobs run: the launcher and, on Slurm, each job's resources; refused where built when a
setting belongs to another launcher."""

from dataclasses import dataclass
from typing import Literal

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.settings import above, at_least, check_settings, setting

Launcher = Literal["local", "slurm"]


@dataclass(frozen=True)
class SlurmConfig:
    """What each Slurm job asks for (one task of the command's job array)."""

    partition: str | None = setting(None, "slurm: partition of the jobs [default: the cluster's default].")
    gpus_per_task: int = setting(0, "slurm: GPUs per job.", valid=at_least(0))
    cpus_per_task: int = setting(1, "slurm: CPU cores per job.", valid=at_least(1))
    mem_gb: float | None = setting(
        None, "slurm: memory per job in GB [default: the partition's].", valid=above(0)
    )
    time_min: int = setting(240, "slurm: time limit per job in minutes.", valid=at_least(1))
    account: str | None = setting(None, "slurm: account charged for the jobs.")
    qos: str | None = setting(None, "slurm: quality of service of the jobs.")
    sbatch: tuple[str, ...] = setting(
        (), "slurm: more sbatch options, comma-separated KEY=VALUE (e.g. constraint=a100,exclusive=)."
    )

    def __post_init__(self) -> None:
        check_settings(self)
        for option in self.sbatch:
            if "=" not in option or not option.split("=", 1)[0]:
                raise UserError(f"--sbatch takes KEY=VALUE options, got {option!r}")

    def sbatch_options(self) -> dict[str, str]:
        """--sbatch as sbatch's long options by name (``exclusive=`` gives a bare ``--exclusive``)."""
        return dict(option.split("=", 1) for option in self.sbatch)


@dataclass(frozen=True)
class LaunchConfig:
    """Where the jobs run: on this machine (``local``) or as one Slurm job array (``slurm``)."""

    launcher: Launcher = setting(
        "local", "Where the jobs run: local (this machine) or slurm (one job array; its settings below)."
    )
    no_wait: bool = setting(
        False,
        "slurm: return once the jobs are submitted; the same command again follows them (and then reports).",
    )
    slurm: SlurmConfig = setting(default_factory=SlurmConfig)

    def __post_init__(self) -> None:
        check_settings(self)
        if self.launcher == "slurm":
            return
        if self.no_wait:
            raise UserError("--no-wait is for --launcher slurm (a local job ends with the command)")
        if self.slurm != SlurmConfig():
            raise UserError("the --partition/--gpus-per-task/... settings are for --launcher slurm")
