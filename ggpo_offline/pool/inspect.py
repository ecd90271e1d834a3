"""Summarize a pool: counts, rewards, mixed groups, lengths, truncation and its metadata."""

from pathlib import Path

import polars as pl

from ggpo_offline.pool.source import open_pool

LENGTH_PERCENTILES = (0.1, 0.5, 0.9, 0.99)


def pool_summary(path: Path | str) -> dict:
    """The numbers ``ggpo pool inspect`` prints, computed lazily by polars without loading the pool."""
    path = Path(path)
    source = open_pool(path)  # a file or a shard directory
    meta = source.metadata
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
    summary = {"path": str(path), **groups, **totals}
    summary["mixed_frac"] = groups["mixed_groups"] / groups["groups"] if groups["groups"] else 0.0
    summary["metadata"] = meta
    return summary
