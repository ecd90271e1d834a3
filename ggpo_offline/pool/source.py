"""Resolve a pool given as one Parquet file or as a directory of shard files written by sharded runs."""

from dataclasses import dataclass
from pathlib import Path

from ggpo_offline.core.errors import UserError
from ggpo_offline.pool.schema import open_parquet, read_file_metadata

# Metadata every shard of one pool must share: what was sampled, from what, and how it was scored.
SHARED_KEYS = (
    "schema_version",
    "model",
    "tokenizer",
    "engine",
    "dtype",
    "sampling",
    "dataset",
    "prompt_template",
    "filter",
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
    """The Parquet files of a pool, in shard order, and the pool's (merged) metadata."""

    path: Path
    files: list[Path]
    metadata: dict


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
    metas = [read_file_metadata(f) for f in files]
    by_index = _check_shards(path, files, metas)
    ordered = [by_index[i] for i in sorted(by_index)]
    return PoolSource(path, [files[i] for i in ordered], merge_metadata([metas[i] for i in ordered]))


def read_pool_metadata(path: Path | str) -> dict:
    """A pool's metadata: a file's footer JSON, or a shard directory's shards merged (checked to agree)."""
    return open_pool(path).metadata


def _check_shards(path: Path, files: list[Path], metas: list[dict]) -> dict[int, int]:
    """Shard index -> position in ``files``, after checking that the shards form one complete pool."""
    by_index: dict[int, int] = {}
    first = None
    for position, (file, meta) in enumerate(zip(files, metas, strict=True)):
        shard = meta.get("shard")
        if not isinstance(shard, dict) or not {"index", "count", "dataset_prompts"} <= shard.keys():
            raise UserError(
                f"{path}: {file.name} is not a shard (no shard metadata); a pool directory "
                "holds only the shard files of one sharded run"
            )
        if first is None:
            first = (file, meta)
        else:
            differing = [
                key for key in (*SHARED_KEYS, "reward") if _shared(meta, key) != _shared(first[1], key)
            ]
            if shard["count"] != first[1]["shard"]["count"]:
                differing.insert(0, "shard count")
            if shard["dataset_prompts"] != first[1]["shard"]["dataset_prompts"]:
                differing.insert(0, "dataset prompt count")
            if differing:
                raise UserError(
                    f"{path}: {file.name} and {first[0].name} are shards of different runs "
                    f"(they differ in {', '.join(differing)})"
                )
        if shard["index"] in by_index:
            other = files[by_index[shard["index"]]].name
            raise UserError(f"{path}: shard {shard['index']} appears twice ({other} and {file.name})")
        by_index[shard["index"]] = position
    count = first[1]["shard"]["count"]
    outside = sorted(i for i in by_index if not 0 <= i < count)
    if outside:
        raise UserError(f"{path}: shard index {outside[0]} is outside 0..{count - 1}")
    missing = [i for i in range(count) if i not in by_index]
    if missing:
        raise UserError(
            f"{path}: {len(missing)} of {count} shards missing (shard {', '.join(map(str, missing))})"
        )
    return by_index


def _shared(meta: dict, key: str):
    value = meta.get(key)
    if key == "reward" and isinstance(value, dict):
        # Timeout/error counters are per shard; the reward rule itself must agree.
        return {k: v for k, v in value.items() if k not in ("timeouts", "errors")}
    return value


def merge_metadata(metas: list[dict]) -> dict:
    """One pool's metadata from its shards' (in shard order): counts and reward counters summed, the latest
    creation time, generation time summed, no shard fields. A single unsharded pool's is returned as is."""
    if len(metas) == 1 and "shard" not in metas[0]:
        return metas[0]
    merged = {k: v for k, v in metas[0].items() if k != "shard"}
    if isinstance(merged.get("counts"), dict):
        counts = {key: sum(m["counts"].get(key, 0) for m in metas) for key in SUMMED_COUNTS}
        reward_sum = sum(m["counts"].get("mean_reward", 0.0) * m["counts"].get("responses", 0) for m in metas)
        counts["mean_reward"] = reward_sum / counts["responses"] if counts["responses"] else 0.0
        merged["counts"] = counts
    if isinstance(merged.get("reward"), dict):
        merged["reward"] = {
            **merged["reward"],
            **{key: sum(m["reward"].get(key, 0) for m in metas) for key in ("timeouts", "errors")},
        }
    if "created" in merged:
        merged["created"] = max(m.get("created", "") for m in metas)
    if "generation_seconds" in merged:
        merged["generation_seconds"] = round(sum(m.get("generation_seconds", 0.0) for m in metas), 2)
    if isinstance(merged.get("config"), dict):
        merged["config"] = {k: v for k, v in merged["config"].items() if k not in SHARD_CONFIG_KEYS}
    return merged


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
