"""The settings of `ggpo pool merge` (the other pool commands take only the pool's path)."""

from dataclasses import dataclass
from pathlib import Path

from ggpo_offline.core.settings import check_settings, setting


@dataclass(frozen=True)
class MergeConfig:
    """Where ``ggpo pool merge`` writes the one pool file of a shard directory."""

    out: Path = setting(help="Pool file to write.")
    overwrite: bool = setting(False, "Replace an existing --out file.")

    def __post_init__(self) -> None:
        check_settings(self)
