"""Benchmark 5: peak RSS and rows/s of validating and planning a synthetic 1M-response pool (streaming).

Baseline (same run, same file): reading the whole pool into memory with ``pyarrow.parquet.read_table``.
Each measurement runs in its own process so that its peak RSS is its own.
"""

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

M = 8
GROUPS_PER_ROW_GROUP = 1024


def write_pool(path: Path, responses: int, seed: int = 0) -> None:
    """A valid pool of ``responses`` rows (groups of 8, 16–96 response tokens), built column-wise."""
    import numpy as np
    import pyarrow as pa

    from ggpo_offline.pool.info import PoolInfo, PoolModel, PoolSampling
    from ggpo_offline.pool.schema import POOL_SCHEMA, SCHEMA_VERSION
    from ggpo_offline.pool.writer import PoolWriter

    rng = np.random.default_rng(seed)
    rows_per_chunk = GROUPS_PER_ROW_GROUP * M
    with PoolWriter(path, overwrite=True) as writer:
        for first in range(0, responses, rows_per_chunk):
            n = min(rows_per_chunk, responses - first)
            group_ids = (first + np.arange(n)) // M
            lengths = rng.integers(16, 97, n)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            tokens = pa.ListArray.from_arrays(offsets, rng.integers(4, 30000, offsets[-1]).astype(np.int32))
            logps = pa.ListArray.from_arrays(offsets, -rng.random(offsets[-1], dtype=np.float32) * 3)
            prompt = pa.ListArray.from_arrays(np.arange(n + 1, dtype=np.int32) * 4, np.ones(n * 4, np.int32))
            text = pa.array(["x"] * n)
            columns = {
                "group_id": pa.array(group_ids, pa.int64()),
                "sample_idx": pa.array(np.arange(n) % M, pa.int16()),
                "prompt_id": pa.array([f"p{g}" for g in group_ids]),
                "source": text,
                "prompt": text,
                "prompt_token_ids": prompt,
                "answer": text,
                "response": text,
                "response_token_ids": tokens,
                "behavior_logprobs": logps,
                "finish_reason": pa.array(["stop"] * n),
                "reward": pa.array((rng.random(n) < 0.5).astype(np.float32)),
                "extracted_answer": pa.nulls(n, pa.string()),
            }
            writer._writer.write_table(pa.table(columns, schema=POOL_SCHEMA))
        footer = PoolInfo(
            schema_version=SCHEMA_VERSION, sampling=PoolSampling(m=M), model=PoolModel(name="synthetic")
        )
        writer.close(footer)


def measure(task: str, path: Path) -> dict:
    start = time.perf_counter()
    if task == "read_table":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).num_rows
    elif task == "validate":
        from ggpo_offline.pool.validate import validate_pool

        rows = validate_pool(path).rows
    else:
        from ggpo_offline.train.pool_index import index_pool, plan_minibatches

        index = index_pool(path)
        plan_minibatches(index, seed=42, updates=400, groups_per_batch=32)
        rows = index.rows
    seconds = time.perf_counter() - start
    return {"task": task, "rows": rows, "seconds": seconds,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--responses", type=int, default=1_000_000)
    parser.add_argument("--one", nargs=2, metavar=("TASK", "POOL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], Path(args.one[1]))))
        return
    with tempfile.TemporaryDirectory() as folder:
        pool = Path(folder) / "big.parquet"
        write_pool(pool, args.responses)
        size_mb = pool.stat().st_size / 2**20
        results = []
        for task in ("read_table", "validate", "plan"):
            out = subprocess.run(
                [sys.executable, __file__, "--one", task, str(pool)],
                capture_output=True,
                text=True,
                check=True,
            )
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = results[0]
    print(f"synthetic pool: {args.responses:,} responses (groups of {M}), {size_mb:,.0f} MB on disk\n")
    print("| task | rows | seconds | rows/s | peak RSS (MB) | RSS vs read_table |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['task']} | {r['rows']:,} | {r['seconds']:.1f} | {r['rows'] / r['seconds']:,.0f} | "
            f"{r['peak_rss_mb']:,.0f} | {r['peak_rss_mb'] / base['peak_rss_mb']:.2f}x |"
        )


if __name__ == "__main__":
    main()
