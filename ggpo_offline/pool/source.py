"""Resolve a pool given as one Parquet file or as a directory of shard files written by sharded runs."""

from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from ggpo_offline.core.errors import UserError
from ggpo_offline.pool.info import PoolCounts, PoolInfo, PoolShard
from ggpo_offline.pool.schema import open_parquet, read_file_metadata

# Footer fields every shard of one pool must share: what was sampled, from what, and how it was scored.
SHARED_FIELDS = (
    "schema_version",
    "model",
    "tokenizer",
    "engine",
    "dtype",
    "sampling",
    "dataset",
    "prompt_template",
    "filter",
    "reward",
)
# Counts that add up over shards (mean_reward is recomputed from the sums).
SUMMED_COUNTS = (
    "prompts",
    "skipped_long_prompts",
    "groups",
    "responses",
    "mixed_groups",
    "tokens",
    "truncated",
)
SHARD_CONFIG_KEYS = ("shard_index", "num_shards")


@dataclass(frozen=True)
class PoolSource:
    """The Parquet files of a pool, in shard order, and the pool's (merged) footer."""

    path: Path
    files: list[Path]
    metadata: dict
    """The footer's JSON object: a file's as stored, a shard directory's merged (`merge_footers`); what
    `pool_fingerprint` hashes."""

    @property
    def info(self) -> PoolInfo:
        """The footer as its typed record."""
        return PoolInfo.from_metadata(self.metadata)

    @cached_property
    def row_groups(self) -> "RowGroups":
        """Its files, opened at their first read: every reader of the pool in one command shares them."""
        return RowGroups(self.files)

    @property
    def rows(self) -> int:
        return sum(parquet.metadata.num_rows for parquet in self.row_groups.parquets)


def shard_files(directory: Path) -> list[Path]:
    """The ``*.parquet`` files directly in ``directory``; hidden ones (temporary, partial runs) skipped."""
    return sorted(p for p in directory.glob("*.parquet") if not p.name.startswith(".") and p.is_file())


def open_pool(path: Path | str) -> PoolSource:
    """A pool file, or a directory holding every shard of one sharded run; UserError naming the problem."""
    path = Path(path)
    if path.is_file():
        return PoolSource(path, [path], read_file_metadata(path))
    if not path.is_dir():
        raise UserError(f"{path}: no such pool file or directory")
    files = shard_files(path)
    if not files:
        raise UserError(f"{path}: a directory without .parquet shard files")
    footers = [PoolInfo.from_metadata(read_file_metadata(f)) for f in files]
    by_index = _check_shards(path, files, footers)
    ordered = [by_index[i] for i in sorted(by_index)]
    merged = merge_footers([footers[i] for i in ordered])
    return PoolSource(path, [files[i] for i in ordered], merged.to_metadata())


def read_pool_info(path: Path | str) -> PoolInfo:
    """The footer record of a pool file, or of a shard directory (its shards' merged)."""
    return open_pool(path).info


def _check_shards(path: Path, files: list[Path], footers: list[PoolInfo]) -> dict[int, int]:
    """Shard index -> position in ``files``, after checking that the shards form one complete pool."""
    by_index: dict[int, int] = {}
    first = None
    for position, (file, footer) in enumerate(zip(files, footers, strict=True)):
        shard = footer.shard
        if None in (shard.index, shard.count, shard.dataset_prompts):
            raise UserError(
                f"{path}: {file.name} is not a shard (no shard metadata); a pool directory "
                "holds only the shard files of one sharded run"
            )
        if first is None:
            first = (file, footer)
        else:
            differing = [name for name in SHARED_FIELDS if _shared(footer, name) != _shared(first[1], name)]
            if shard.count != first[1].shard.count:
                differing.insert(0, "shard count")
            if shard.dataset_prompts != first[1].shard.dataset_prompts:
                differing.insert(0, "dataset prompt count")
            if differing:
                raise UserError(
                    f"{path}: {file.name} and {first[0].name} are shards of different runs "
                    f"(they differ in {', '.join(differing)})"
                )
        if shard.index in by_index:
            other = files[by_index[shard.index]].name
            raise UserError(f"{path}: shard {shard.index} appears twice ({other} and {file.name})")
        by_index[shard.index] = position
    count = first[1].shard.count
    outside = sorted(i for i in by_index if not 0 <= i < count)
    if outside:
        raise UserError(f"{path}: shard index {outside[0]} is outside 0..{count - 1}")
    missing = [i for i in range(count) if i not in by_index]
    if missing:
        raise UserError(
            f"{path}: {len(missing)} of {count} shards missing (shard {', '.join(map(str, missing))})"
        )
    return by_index


def _shared(footer: PoolInfo, name: str):
    value = getattr(footer, name)
    if name == "reward":
        # Timeout/error counters are per shard; the reward rule itself must agree.
        return replace(value, timeouts=None, errors=None)
    return value


def merge_footers(shards: list[PoolInfo]) -> PoolInfo:
    """One pool's footer from its shards' (in shard order): counts and reward counters summed, the latest
    creation time, generation time summed, no shard fields; everything else (unknown keys included) the
    first shard's, which the others share (`_check_shards`). A shard's unknown counts are left out: they
    count the shard, not the pool."""
    first = shards[0]
    changes: dict = {"shard": PoolShard()}
    if first.counts.to_dict():
        counts = {key: sum(getattr(s.counts, key) or 0 for s in shards) for key in SUMMED_COUNTS}
        reward_sum = sum((s.counts.mean_reward or 0.0) * (s.counts.responses or 0) for s in shards)
        mean_reward = reward_sum / counts["responses"] if counts["responses"] else 0.0
        changes["counts"] = PoolCounts(**counts, mean_reward=mean_reward)
    if first.reward.to_dict():
        timeouts = sum(s.reward.timeouts or 0 for s in shards)
        errors = sum(s.reward.errors or 0 for s in shards)
        changes["reward"] = replace(first.reward, timeouts=timeouts, errors=errors)
    if first.created is not None:
        changes["created"] = max(s.created or "" for s in shards)
    if first.generation_seconds is not None:
        changes["generation_seconds"] = round(sum(s.generation_seconds or 0.0 for s in shards), 2)
    if isinstance(first.config, dict):
        changes["config"] = {k: v for k, v in first.config.items() if k not in SHARD_CONFIG_KEYS}
    return replace(first, **changes)


class RowGroups:
    """The row groups of all of a pool's files under one global numbering (file order, then row group)."""

    def __init__(self, files: list[Path]):
        self.parquets = [open_parquet(f) for f in files]
        self.locations = [(i, rg) for i, p in enumerate(self.parquets) for rg in range(p.num_row_groups)]

    def __len__(self) -> int:
        return len(self.locations)

    def read(self, row_group: int, columns: list[str] | None = None):
        """One row group (global number) as an Arrow table."""
        file, local = self.locations[row_group]
        return self.parquets[file].read_row_group(local, columns=columns)

    def read_many(self, row_groups: list[int], columns: list[str] | None = None):
        """Several row groups (global numbers, in the order given) as one Arrow table."""
        import pyarrow as pa

        return pa.concat_tables([self.read(rg, columns) for rg in row_groups])

    @property
    def num_rows(self) -> int:
        return sum(p.metadata.num_rows for p in self.parquets)
