"""Summarize a pool: counts, rewards, mixed groups, lengths, truncation and its metadata."""

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ggpo_offline.pool.info import PoolInfo
from ggpo_offline.pool.source import PoolSource, open_pool

LENGTH_PERCENTILES = (0.1, 0.5, 0.9, 0.99)


@dataclass(frozen=True)
class PoolSummary:
    """What ``ggpo pool inspect`` prints and compare's README quotes: the pool's footer and the numbers
    counted from its rows. Never written to a file."""

    path: str
    """The pool as given: a file or a shard directory."""
    groups: int
    mixed_groups: int
    """Groups with a correct and a wrong response (the ones training reads)."""
    all_wrong_groups: int
    all_right_groups: int
    responses: int
    mean_reward: float | None
    truncated_frac: float | None
    """Share of responses cut at max_tokens (finish_reason = length)."""
    tokens: int
    """Response tokens."""
    mean_length: float | None
    max_length: int | None
    p10: int | None
    p50: int | None
    p90: int | None
    p99: int | None
    mixed_frac: float
    info: PoolInfo
    """The footer."""


def pool_summary(pool: Path | str | PoolSource) -> PoolSummary:
    """The numbers ``ggpo pool inspect`` prints, computed lazily by polars without loading the pool (a file
    or a shard directory, or one already opened)."""
    source = pool if isinstance(pool, PoolSource) else open_pool(pool)
    rows = pl.scan_parquet(source.files).select(
        pl.col("group_id"),
        pl.col("reward"),
        pl.col("finish_reason"),
        pl.col("response_token_ids").list.len().alias("length"),
    )
    totals = (
        rows.select(
            pl.len().alias("responses"),
            pl.col("reward").mean().alias("mean_reward"),
            (pl.col("finish_reason") == "length").mean().alias("truncated_frac"),
            pl.col("length").sum().alias("tokens"),
            pl.col("length").mean().alias("mean_length"),
            pl.col("length").max().alias("max_length"),
            *[
                pl.col("length").quantile(q, "nearest").cast(pl.Int64).alias(f"p{round(q * 100)}")
                for q in LENGTH_PERCENTILES
            ],
        )
        .collect()
        .row(0, named=True)
    )
    groups = (
        rows.group_by("group_id")
        .agg(pl.col("reward").sum().alias("correct"), pl.len().alias("size"))
        .select(
            pl.len().alias("groups"),
            ((pl.col("correct") > 0) & (pl.col("correct") < pl.col("size"))).sum().alias("mixed_groups"),
            (pl.col("correct") == 0).sum().alias("all_wrong_groups"),
            (pl.col("correct") == pl.col("size")).sum().alias("all_right_groups"),
        )
        .collect()
        .row(0, named=True)
    )
    mixed_frac = groups["mixed_groups"] / groups["groups"] if groups["groups"] else 0.0
    return PoolSummary(path=str(source.path), **groups, **totals, mixed_frac=mixed_frac, info=source.info)
