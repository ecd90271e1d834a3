"""Sharded pools: a directory of shard files reads, validates and merges as one pool."""

from dataclasses import replace

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from conftest import synthetic_metadata, synthetic_rows, write_synthetic_pool

from ggpo_offline.core.errors import UserError
from ggpo_offline.generate.engines import SamplingSettings
from ggpo_offline.pool.inspect import pool_summary
from ggpo_offline.pool.merge import merge_pool
from ggpo_offline.pool.source import read_pool_info
from ggpo_offline.pool.validate import PoolInvalid, validate_pool
from ggpo_offline.train.minibatch import MinibatchReader
from ggpo_offline.train.pool_index import index_pool, pool_fingerprint


def shard_metadata(m: int, index: int, count: int, groups: int, **changes) -> dict:
    meta = synthetic_metadata(m) | {"shard": {"index": index, "count": count, "dataset_prompts": groups}}
    meta["counts"] = {"groups": 0, "responses": 0, "mean_reward": 0.0}
    return meta | changes


def write_shards(directory, groups=11, m=4, count=3, indices=None, **changes) -> list[dict]:
    """Rows of an unsharded synthetic pool, written as shards: group g goes to shard g % count."""
    rows = synthetic_rows(groups, m, seed=5)
    directory.mkdir(exist_ok=True)
    for index in range(count) if indices is None else indices:
        write_synthetic_pool(
            directory / f"shard-{index}.parquet",
            rows=[r for r in rows if r["group_id"] % count == index],
            metadata=shard_metadata(m, index, count, groups, **changes),
            rows_per_group_chunk=2 * m,  # several row groups per shard
        )
    return rows


def test_a_shard_directory_reads_like_its_merged_file(tmp_path):
    rows = write_shards(tmp_path / "shards")
    merged = merge_pool(tmp_path / "shards", tmp_path / "merged.parquet")

    assert (
        pq.read_table(merged).to_pylist()
        == pq.read_table(write_synthetic_pool(tmp_path / "one.parquet", rows=rows, m=4)).to_pylist()
    )
    report = validate_pool(tmp_path / "shards")
    assert (report.rows, report.groups, report.group_size) == (44, 11, 4)
    meta = read_pool_info(merged).raw
    assert "shard" not in meta and meta == read_pool_info(tmp_path / "shards").raw
    assert pool_fingerprint(tmp_path / "shards") == pool_fingerprint(merged)

    by_dir, by_file = index_pool(tmp_path / "shards"), index_pool(merged)
    assert by_dir.mixed_group_ids.tolist() == by_file.mixed_group_ids.tolist()
    assert by_dir.mixed_group_ids.tolist() == sorted(by_dir.mixed_group_ids.tolist())
    assert (by_dir.total_groups, by_dir.rows) == (11, 44)
    wanted = by_dir.mixed_group_ids.tolist()[::-1][:4]
    a = MinibatchReader(tmp_path / "shards", by_dir, pad_id=0).read(wanted)
    b = MinibatchReader(merged, by_file, pad_id=0).read(wanted)
    assert a.group_ids == b.group_ids == wanted
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.behavior_logp, b.behavior_logp)
    assert torch.equal(a.rewards, b.rewards)

    summary_dir, summary_file = pool_summary(tmp_path / "shards"), pool_summary(merged)
    assert replace(summary_dir, path="") == replace(summary_file, path="")


def test_merged_metadata_sums_counts_and_drops_shard_fields(tmp_path):
    directory = tmp_path / "shards"
    directory.mkdir()
    for index, (responses, mean, timeouts) in enumerate([(8, 0.5, 1), (24, 0.25, 2)]):
        meta = shard_metadata(4, index, 2, 5)
        meta["counts"] = {"groups": responses // 4, "responses": responses, "mean_reward": mean, "tokens": 10}
        meta["reward"] = {"extraction_rule": "last-boxed", "timeouts": timeouts, "errors": 0}
        meta["config"] = {"shard_index": index, "num_shards": 2, "batch_prompts": 4}
        meta["created"] = f"2025-01-0{index + 1}"
        rows = [r for r in synthetic_rows(5, 4) if r["group_id"] % 2 == index][:responses]
        write_synthetic_pool(directory / f"s{index}.parquet", rows=rows, metadata=meta)
    meta = read_pool_info(directory).raw
    assert meta["counts"] == {
        "groups": 8,
        "responses": 32,
        "mean_reward": pytest.approx((8 * 0.5 + 24 * 0.25) / 32),
        "tokens": 20,
        "prompts": 0,
        "skipped_long_prompts": 0,
        "mixed_groups": 0,
        "truncated": 0,
    }
    assert meta["reward"] == {"extraction_rule": "last-boxed", "timeouts": 3, "errors": 0}
    assert meta["config"] == {"batch_prompts": 4} and meta["created"] == "2025-01-02" and "shard" not in meta


def test_footer_keys_this_version_does_not_know_survive_a_merge(tmp_path):
    unknown = {
        "later_section": {"a": [1, None]},
        "engine": {"name": "hf", "version": None, "build": "x"},
        "sampling": {"m": 4, "min_p": 0.05},
    }
    write_shards(tmp_path / "shards", count=2, **unknown)
    merged = read_pool_info(merge_pool(tmp_path / "shards", tmp_path / "merged.parquet")).raw
    assert {key: merged[key] for key in unknown} == unknown
    assert merged == read_pool_info(tmp_path / "shards").raw and "shard" not in merged


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: write_shards(d, indices=[0, 2], count=4), r"2 of 4 shards missing \(shard 1, 3\)"),
        (
            lambda d: (
                write_shards(d, count=2),
                write_shards(d / "x", count=2),
                (d / "x" / "shard-1.parquet").rename(d / "again.parquet"),
            ),
            r"shard 1 appears twice \(again.parquet and shard-1.parquet\)",
        ),
        (
            lambda d: (
                write_shards(d, count=2, indices=[0]),
                write_shards(d / "x", count=2, indices=[1], sampling={"m": 4, "seed": 9}),
                (d / "x" / "shard-1.parquet").rename(d / "shard-1.parquet"),
            ),
            r"shard-1.parquet and shard-0.parquet are shards of different runs \(they differ in sampling\)",
        ),
        (
            lambda d: (write_shards(d, count=2), write_synthetic_pool(d / "plain.parquet")),
            r"plain.parquet is not a shard",
        ),
        (lambda d: d.mkdir(), r"a directory without .parquet shard files"),
    ],
)
def test_a_broken_shard_directory_is_named_in_one_line(tmp_path, setup, message):
    directory = tmp_path / "shards"
    setup(directory)
    for call in (validate_pool, read_pool_info, index_pool, pool_summary):
        with pytest.raises(UserError, match=message):
            call(directory)
    with pytest.raises(UserError, match=message):
        merge_pool(directory, tmp_path / "merged.parquet")
    assert not (tmp_path / "merged.parquet").exists()


def test_a_group_in_two_shards_is_refused(tmp_path):
    directory = tmp_path / "shards"
    rows = write_shards(directory, count=2, indices=[0])
    shard_1 = [r for r in rows if r["group_id"] % 2 == 1] + [r for r in rows if r["group_id"] == 4]
    write_synthetic_pool(directory / "shard-1.parquet", rows=shard_1, metadata=shard_metadata(4, 1, 2, 11))
    with pytest.raises(PoolInvalid, match=r"group 4 appears in two shards \(shard-0.parquet and shard-1"):
        validate_pool(directory)


def test_merge_never_replaces_a_file_without_overwrite(tmp_path):
    write_shards(tmp_path / "shards")
    out = write_synthetic_pool(tmp_path / "merged.parquet", groups=2)
    before = out.read_bytes()
    with pytest.raises(UserError, match="already exists; pass --overwrite"):
        merge_pool(tmp_path / "shards", out)
    assert out.read_bytes() == before
    assert validate_pool(merge_pool(tmp_path / "shards", out, overwrite=True)).groups == 11
    with pytest.raises(UserError, match="inside the shard directory"):
        merge_pool(tmp_path / "shards", tmp_path / "shards" / "all.parquet")


def test_hf_engine_refuses_parallel_sizes(tmp_path):
    from ggpo_offline.generate.pipeline import GenerateConfig

    for sizes in ({"tensor_parallel_size": 2}, {"data_parallel_size": 2}):
        with pytest.raises(
            UserError, match="--tensor-parallel-size and --data-parallel-size need --engine vllm"
        ):
            GenerateConfig(engine="hf", out=tmp_path / "p.parquet", **sizes)
    with pytest.raises(UserError, match=r"--shard-index must be in 0..1, got 2"):
        GenerateConfig(engine="hf", out=tmp_path / "p.parquet", shard_index=2, num_shards=2)
    assert not (tmp_path / "p.parquet").exists()


@pytest.mark.vllm
def test_the_union_of_shards_is_the_unsharded_pool(vllm_engine, tmp_path):
    """Three shards, batched differently from the unsharded run, merge into the same rows."""
    from ggpo_offline.generate.pipeline import GenerateConfig, generate_pool

    def generate(out, **settings):
        config = GenerateConfig(
            num_prompts=14,
            sampling=SamplingSettings(m=4, max_tokens=32, seed=11),
            out=out,
            reward_workers=0,
            **settings,
        )
        return generate_pool(config, engine=vllm_engine)

    whole = generate(tmp_path / "whole.parquet", batch_prompts=8)
    for index in range(3):
        shard = generate(
            tmp_path / "shards" / f"s{index}.parquet", batch_prompts=2, shard_index=index, num_shards=3
        )
        meta = read_pool_info(shard).raw
        assert meta["shard"] == {"index": index, "count": 3, "dataset_prompts": 14}
        assert meta["counts"]["prompts"] == len(range(index, 14, 3))
        assert set(pq.read_table(shard).column("group_id").to_pylist()) == set(range(index, 14, 3))
    merged = merge_pool(tmp_path / "shards", tmp_path / "merged.parquet")
    merged_table, whole_table = pq.read_table(merged), pq.read_table(whole)
    # vLLM's CPU kernels are not batch-invariant: another batch composition changes summation orders, so a
    # token's log-prob moves by rounding noise of the engine's dtype, while every sampled token, reward and
    # other field is identical. Measured: fp32 up to 2.2e-5; bf16 (what dtype "auto" picks on a CPU with
    # AVX-512) up to 8.2e-4 (-0.01551 vs -0.01469) — bf16 keeps 8 significant bits, so a logit of a few
    # units can move by ~1e-2.
    whole_meta, joined = read_pool_info(whole).raw, read_pool_info(merged).raw
    tolerance = 1e-2 if whole_meta["dtype"] in ("bfloat16", "float16") else 1e-4
    logprobs = "behavior_logprobs"
    assert merged_table.drop_columns([logprobs]).equals(whole_table.drop_columns([logprobs]))
    for got, want in zip(merged_table[logprobs].to_pylist(), whole_table[logprobs].to_pylist(), strict=True):
        np.testing.assert_allclose(got, want, atol=tolerance, rtol=0)
    for key in ("sampling", "dataset", "model", "engine", "filter", "prompt_template"):
        assert joined[key] == whole_meta[key], key
    assert {k: v for k, v in joined["counts"].items() if k != "mean_reward"} == {
        k: v for k, v in whole_meta["counts"].items() if k != "mean_reward"
    }
    assert joined["counts"]["mean_reward"] == pytest.approx(whole_meta["counts"]["mean_reward"], abs=1e-12)


@pytest.mark.vllm
def test_vllm_data_parallel_refusal_is_one_line(tiny_dir):
    from ggpo_offline.generate.engines import load_engine

    with pytest.raises(
        UserError, match=r"vLLM refused the engine settings: .*data_parallel_size=2.*--num-shards 2"
    ):
        load_engine("vllm", tiny_dir, "auto", 512, 0, data_parallel_size=2)


def test_pool_commands_take_a_shard_directory(tmp_path):
    from test_cli import assert_one_error_line, ggpo, ggpo_here

    write_shards(tmp_path / "shards")
    validated = ggpo("pool", "validate", str(tmp_path / "shards"))
    assert validated.returncode == 0 and "valid pool, 11 groups x 4 = 44 responses" in validated.stdout
    merged = ggpo("pool", "merge", str(tmp_path / "shards"), "--out", str(tmp_path / "all.parquet"))
    assert merged.returncode == 0 and validate_pool(tmp_path / "all.parquet").groups == 11
    again = ggpo_here("pool", "merge", str(tmp_path / "shards"), "--out", str(tmp_path / "all.parquet"))
    assert_one_error_line(again, "already exists; pass --overwrite")
    (tmp_path / "shards" / "shard-1.parquet").unlink()
    assert_one_error_line(
        ggpo_here("pool", "inspect", str(tmp_path / "shards")), "1 of 3 shards missing (shard 1)"
    )


def test_training_on_a_shard_directory_equals_training_on_its_merged_file(hf_pool, tmp_path):
    from dataclasses import replace

    from ggpo_offline.train.config import TrainConfig
    from ggpo_offline.train.trainer import train

    table, meta = pq.read_table(hf_pool), read_pool_info(hf_pool).raw
    (tmp_path / "shards").mkdir()
    for index in range(2):
        rows = [r for r in table.to_pylist() if r["group_id"] % 2 == index]
        shard_meta = meta | {"shard": {"index": index, "count": 2, "dataset_prompts": 16}}
        write_synthetic_pool(tmp_path / "shards" / f"s{index}.parquet", rows=rows, metadata=shard_meta, m=4)
    merged = merge_pool(tmp_path / "shards", tmp_path / "merged.parquet")
    base = TrainConfig(pool=merged, updates=2, groups_per_batch=2, lr=1e-4, no_tracking=True, ref_refresh=1)
    from_file = train(replace(base, out=tmp_path / "a"))
    from_dir = train(replace(base, pool=tmp_path / "shards", out=tmp_path / "b"))
    assert from_dir.fingerprints == from_file.fingerprints  # the pool's and the data order's
    assert from_dir.metrics == from_file.metrics
