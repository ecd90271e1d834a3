"""The pool file: atomic streaming writes, validation of every invariant, and the inspect summary."""

import json

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import synthetic_metadata, synthetic_rows, write_synthetic_pool

from ggpo_offline.core.errors import UserError
from ggpo_offline.pool.inspect import pool_summary
from ggpo_offline.pool.schema import METADATA_KEY, POOL_SCHEMA
from ggpo_offline.pool.source import read_pool_info
from ggpo_offline.pool.validate import PoolInvalid, validate_pool
from ggpo_offline.pool.writer import PoolWriter


def test_roundtrip_with_plain_pyarrow_and_polars(tmp_path):
    rows = synthetic_rows(groups=5, m=4)
    path = write_synthetic_pool(tmp_path / "p.parquet", rows=rows, rows_per_group_chunk=8)
    assert pq.ParquetFile(path).num_row_groups == 3
    table = pq.read_table(path)
    assert table.schema.equals(POOL_SCHEMA, check_metadata=False)
    exact = [name for name in POOL_SCHEMA.names if name != "behavior_logprobs"]
    assert table.select(exact).to_pylist() == [{k: r[k] for k in exact} for r in rows]
    for stored, row in zip(table.column("behavior_logprobs").to_pylist(), rows, strict=True):
        assert stored == list(np.float32(row["behavior_logprobs"]))
    frame = pl.read_parquet(path)
    assert frame.height == 20 and frame["reward"].to_list() == [r["reward"] for r in rows]
    meta = json.loads(pq.read_metadata(path).metadata[METADATA_KEY])
    assert meta == synthetic_metadata(4) == read_pool_info(path).raw


def test_provenance_is_the_schema_metadata_arrow_readers_look_at(tmp_path):
    path = write_synthetic_pool(tmp_path / "p.parquet", groups=2)
    for schema in (pq.read_schema(path), pq.read_table(path).schema, pq.ParquetFile(path).schema_arrow):
        assert json.loads(schema.metadata[METADATA_KEY]) == synthetic_metadata(4)
        assert schema.remove_metadata() == POOL_SCHEMA  # exact types and nullability without the Arrow copy


def test_writer_never_leaves_a_partial_pool(tmp_path):
    path = tmp_path / "pool.parquet"
    with pytest.raises(RuntimeError), PoolWriter(path) as writer:
        writer.write_rows(synthetic_rows(2, 4))
        raise RuntimeError("killed mid-run")
    assert list(tmp_path.iterdir()) == []


def test_existing_pool_is_kept_without_overwrite_and_until_the_new_one_is_complete(tmp_path):
    path = write_synthetic_pool(tmp_path / "pool.parquet", groups=3)
    before = path.read_bytes()
    with pytest.raises(UserError, match="already exists; pass --overwrite"):
        PoolWriter(path)
    with pytest.raises(RuntimeError), PoolWriter(path, overwrite=True) as writer:
        writer.write_rows(synthetic_rows(2, 4, seed=1))
        raise RuntimeError("interrupted")
    assert path.read_bytes() == before
    write_synthetic_pool(path, groups=2)
    assert validate_pool(path).groups == 2


def test_validate_accepts_a_valid_pool(tmp_path):
    path = write_synthetic_pool(tmp_path / "p.parquet", groups=7, m=3, rows_per_group_chunk=5)
    report = validate_pool(path, batch_size=4)  # batches that cut through groups
    assert (report.rows, report.groups, report.group_size) == (21, 7, 3)
    assert "valid pool, 7 groups x 3 = 21 responses" in report.summary()


def _mutated(tmp_path, mutate, m=4):
    rows = synthetic_rows(groups=4, m=m)
    mutate(rows)
    return write_synthetic_pool(tmp_path / "bad.parquet", rows=rows, m=m)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda rows: rows[5].update(behavior_logprobs=rows[5]["behavior_logprobs"] + [-0.1]),
            r"row 5, column 'behavior_logprobs': has \d+ values for \d+ response tokens",
        ),
        (
            lambda rows: rows[6]["behavior_logprobs"].__setitem__(0, float("nan")),
            r"row 6, column 'behavior_logprobs': holds nan",
        ),
        (
            lambda rows: rows[2]["behavior_logprobs"].__setitem__(-1, 0.5),
            r"row 2, column 'behavior_logprobs': holds 0.5",
        ),
        (
            lambda rows: rows[3]["behavior_logprobs"].__setitem__(0, float("-inf")),
            r"row 3, column 'behavior_logprobs': holds -inf",
        ),
        (lambda rows: rows[9].update(reward=2.0), r"row 9, column 'reward': is 2.0, expected 0 or 1"),
        (lambda rows: rows[4].update(finish_reason="abort"), r"row 4, column 'finish_reason'"),
        (
            lambda rows: rows[7].update(response_token_ids=[], behavior_logprobs=[]),
            r"row 7, column 'response_token_ids': is empty",
        ),
        (
            lambda rows: rows.__setitem__(slice(8, 12), [dict(r) for r in rows[0:4]]),
            r"row 8, column 'group_id': group 0 appears again",
        ),
        (lambda rows: rows.pop(7), r"row 6, column 'group_id': group 1 has 3 rows, expected m = 4"),
        (lambda rows: rows[1].update(sample_idx=3), r"row 1, column 'sample_idx': is 3, expected 1"),
        (lambda rows: rows[2].update(prompt_id="other"), r"row 2, column 'prompt_id': prompt_id changes"),
    ],
)
def test_validate_names_the_first_problem(tmp_path, mutate, message):
    path = _mutated(tmp_path, mutate)
    with pytest.raises(PoolInvalid, match=message):
        validate_pool(path)


def _rewrite(tmp_path, table: pa.Table, metadata: dict | None) -> str:
    path = tmp_path / "raw.parquet"
    if metadata is not None:
        table = table.replace_schema_metadata({METADATA_KEY: json.dumps(metadata)})
    pq.write_table(table, path)
    return path


def test_validate_schema_and_metadata_problems(tmp_path):
    table = pa.Table.from_pylist(synthetic_rows(3, 4), schema=POOL_SCHEMA)
    meta = synthetic_metadata(4)
    with pytest.raises(PoolInvalid, match="column 'reward' is missing"):
        validate_pool(_rewrite(tmp_path, table.drop_columns(["reward"]), meta))
    retyped = table.set_column(
        table.schema.get_field_index("reward"), "reward", table.column("reward").cast(pa.float64())
    )
    with pytest.raises(PoolInvalid, match="column 'reward' has type double, expected float"):
        validate_pool(_rewrite(tmp_path, retyped, meta))
    with pytest.raises(UserError, match="no 'ggpo_offline' metadata"):
        validate_pool(_rewrite(tmp_path, table, None))
    with pytest.raises(PoolInvalid, match="sampling.m is None"):
        validate_pool(_rewrite(tmp_path, table, {"schema_version": 1}))
    with pytest.raises(PoolInvalid, match="group 0 has 4 rows, expected m = 3"):
        validate_pool(_rewrite(tmp_path, table, synthetic_metadata(3)))


def test_validate_refuses_truncated_and_non_parquet_files(tmp_path):
    path = write_synthetic_pool(tmp_path / "p.parquet", groups=20)
    data = path.read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="not a readable Parquet file"):
        validate_pool(tmp_path / "cut.parquet")
    (tmp_path / "text.parquet").write_text("hello")
    with pytest.raises(UserError, match="not a readable Parquet file"):
        validate_pool(tmp_path / "text.parquet")
    with pytest.raises(UserError, match="no such pool file"):
        validate_pool(tmp_path / "missing.parquet")


def test_inspect_summary_matches_a_direct_computation(tmp_path):
    rows = synthetic_rows(groups=9, m=4, seed=3)
    path = write_synthetic_pool(tmp_path / "p.parquet", rows=rows, m=4)
    summary = pool_summary(path)
    rewards = np.array([r["reward"] for r in rows]).reshape(9, 4).sum(axis=1)
    lengths = np.array([len(r["response_token_ids"]) for r in rows])
    assert summary.groups == 9 and summary.responses == 36
    assert summary.mixed_groups == int(((rewards > 0) & (rewards < 4)).sum())
    assert summary.all_wrong_groups == int((rewards == 0).sum())
    assert summary.mean_reward == pytest.approx(np.mean([r["reward"] for r in rows]))
    assert summary.tokens == lengths.sum() and summary.max_length == lengths.max()
    assert summary.truncated_frac == pytest.approx(np.mean([r["finish_reason"] == "length" for r in rows]))
    assert summary.p50 in set(lengths.tolist())
    assert summary.mixed_frac == summary.mixed_groups / 9 and summary.path == str(path)
    assert summary.info == read_pool_info(path)  # the footer, typed
