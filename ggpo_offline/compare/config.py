"""`ggpo compare`'s own settings: which methods and seeds on which pool, and where the report goes."""

from dataclasses import dataclass, field
from pathlib import Path

from ggpo_offline.core.settings import setting

DEFAULT_METHODS = ("grpo", "grpo-tis", "agro", "ggpo")
DEFAULT_SEEDS = (42, 1234, 2027)


@dataclass(frozen=True)
class CompareConfig:
    """What ``ggpo compare`` runs and where it writes."""

    pool: Path = setting(Path("pools/base.parquet"), "Pool every run replays.")
    methods: tuple[str, ...] = setting(DEFAULT_METHODS, "Comma-separated learners.")
    seeds: tuple[int, ...] = setting(DEFAULT_SEEDS, "Comma-separated training seeds.")
    preset: str | None = setting(None, "Training preset of every run: paper-offline or tiny.")
    config_file: Path | None = setting(
        None, "TOML/YAML/JSON file of training settings shared by all runs.", flag="config"
    )
    settings: dict = field(default_factory=dict)
    """Training settings shared by every run, by TrainConfig field name (``ggpo compare``'s train flags)."""
    out: Path | None = setting(None, "Report folder [default: reports/<pool name>/].")
    rerun: bool = setting(False, "Train every run again instead of reusing it.")

    @property
    def report_dir(self) -> Path:
        return self.out if self.out is not None else Path("reports") / Path(self.pool).stem
