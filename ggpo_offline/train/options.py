"""How `ggpo train` runs, beside what it trains: presets and config files, processes, resume, timeouts."""

from dataclasses import dataclass
from pathlib import Path

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.settings import flag_name, setting


@dataclass(frozen=True)
class Timeouts:
    """How long (seconds) a process of the job waits for the others before the job stops: at any
    collective or barrier, and while rank 0 works alone (scoring the π0 cache, evaluating a checkpoint)."""

    collective: float = 1800.0
    solo: float = 7200.0


DEFAULT_TIMEOUTS = Timeouts()


@dataclass(frozen=True)
class TrainOptions:
    """How ``ggpo train`` runs, beside what it trains (`TrainConfig`)."""

    preset: str | None = setting(
        None, "paper-offline (SPEC defaults), tiny (embedded model, ~1 min) or arc (embedded, the long run)."
    )
    config_file: Path | None = setting(
        None, "TOML/YAML/JSON file of settings (flags override it).", flag="config"
    )
    nproc: int | None = setting(
        None, "Train in N processes on this machine (torchrun; DDP, or FSDP2 with --fsdp) [default: 1]."
    )
    resume: bool = setting(False, "Continue the run in --out from its last checkpoint.")
    overwrite: bool = setting(False, "Replace an existing run folder.")
    dry_run: bool = setting(
        False,
        "Print the plan (settings, data, evaluations, a time estimate) after every check the real run makes, "
        "and exit; writes nothing.",
    )
    collective_timeout: float = setting(
        DEFAULT_TIMEOUTS.collective,
        "With several processes: seconds a process waits for the others at a collective before the job "
        "stops (a stuck or dead peer).",
    )
    wait_timeout: float = setting(
        DEFAULT_TIMEOUTS.solo,
        "With several processes: seconds the others wait while process 0 works alone (one checkpoint's "
        "evaluation, scoring the π0 cache), and the longest one evaluation may take.",
    )

    @property
    def timeouts(self) -> Timeouts:
        return Timeouts(self.collective_timeout, self.wait_timeout)


def check_options(options: TrainOptions) -> None:
    """Ranges of `TrainOptions` (one error line)."""
    if options.nproc is not None and options.nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {options.nproc}")
    for name in ("collective_timeout", "wait_timeout"):
        if not getattr(options, name) > 0:
            raise UserError(
                f"--{flag_name(TrainOptions, name)} must be > 0 seconds, got {getattr(options, name)}"
            )
