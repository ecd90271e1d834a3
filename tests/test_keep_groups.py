"""--keep-groups and --first-prompt: a pool of exactly K kept groups (Algorithm 1's lines 5-10: prompts drawn
until N x G mixed groups are collected, the first N x G kept), and the next pool from the prompt where it
stopped; each holds the rows the one-pass pool holds for its prompts."""

import dataclasses

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import hf_pool_config

from ggpo_offline.core.errors import UserError
from ggpo_offline.generate.pipeline import KeptEngine, generate_pool
from ggpo_offline.generate.worker_pool import worker_processes
from ggpo_offline.pool.partial import partial_dir
from ggpo_offline.pool.source import read_pool_info

MIXED = {"mixed_only": True, "batch_prompts": 4}
"""Mixed groups only, several batches: a pool of K groups stops inside one."""


def mixed_group_ids(table: pa.Table) -> list[int]:
    """The ids of the groups whose rewards are neither all 0 nor all 1, in pool order."""
    groups = table.group_by("group_id", use_threads=False).aggregate([("reward", "sum"), ("reward", "count")])
    columns = (groups[name].to_pylist() for name in ("group_id", "reward_sum", "reward_count"))
    return sorted(group for group, correct, size in zip(*columns, strict=True) if 0 < correct < size)


def rows_of(table: pa.Table, group_ids: list[int]) -> pa.Table:
    return table.filter(pc.is_in(table["group_id"], pa.array(group_ids, pa.int64())))


class Crash(Exception):
    """Stands in for a crash after the batch that kept the last group was stored."""


def test_a_pool_stops_at_its_kept_groups_and_the_next_one_continues_from_there(hf_pool, tmp_path):
    """The first pool crashes once its last group's batch is stored, and resumes without sampling again."""
    whole = pq.read_table(hf_pool)
    mixed = mixed_group_ids(whole)
    assert len(mixed) >= 4, mixed  # the fixture's pool has enough mixed groups for two pools of two

    config = hf_pool_config(tmp_path / "a.parquet", keep_groups=2, **MIXED)

    def crash_once_kept(progress) -> None:
        if progress.groups_kept == 2:
            raise Crash

    with pytest.raises(Crash):
        generate_pool(config, on_batch=crash_once_kept)
    sampled = []
    first = generate_pool(config, on_batch=lambda progress: sampled.append(progress.prompts_done))
    assert sampled == []  # nothing left to sample
    assert pq.read_table(first).equals(rows_of(whole, mixed[:2]))
    used = read_pool_info(first).counts.prompts
    assert used == mixed[1] + 1  # the prompts up to the second mixed group's, and none after it
    assert {"first_prompt": 0, "keep_groups": 2}.items() <= read_pool_info(first).config.items()

    config = hf_pool_config(tmp_path / "b.parquet", keep_groups=2, first_prompt=used, **MIXED)
    second = generate_pool(config)
    assert pq.read_table(second).equals(rows_of(whole, mixed[2:4]))  # a group's id: its dataset position
    assert read_pool_info(second).counts.prompts == mixed[3] + 1 - used


def test_too_few_kept_groups_write_nothing_and_say_how_to_get_more(hf_pool, tmp_path):
    out = tmp_path / "pool.parquet"
    whole = pq.read_table(hf_pool)
    last = mixed_group_ids(whole)[-1]  # from the last mixed group's prompt on, one group can be kept
    with pytest.raises(UserError) as refused:
        generate_pool(hf_pool_config(out, mixed_only=True, keep_groups=2, first_prompt=last))
    prompts = f"{16 - last} prompt" + ("s" if 16 - last > 1 else "")
    assert str(refused.value) == (
        f"--keep-groups 2: the {prompts} from --first-prompt {last} kept 1 group; nothing written (give "
        "more prompts with --num-prompts)"
    )
    assert not out.exists() and not partial_dir(out).exists()
    with pytest.raises(
        UserError, match=r"^--first-prompt 16 is past the dataset's last prompt \(16 prompts\)$"
    ):
        generate_pool(hf_pool_config(out, first_prompt=16))


def test_keep_groups_and_first_prompt_are_checked_in_one_line(tmp_path):
    config = hf_pool_config(tmp_path / "pool.parquet")
    for changes, message in [
        ({"keep_groups": 0}, "--keep-groups must be >= 1, got 0"),
        ({"first_prompt": -1}, "--first-prompt must be >= 0, got -1"),
        (
            {"keep_groups": 4, "num_shards": 2},
            "--keep-groups stops one run at its count: give it without --num-shards",
        ),
    ]:
        with pytest.raises(UserError) as refused:
            generate_pool(dataclasses.replace(config, **changes))
        assert str(refused.value) == message


def test_pools_sampled_by_one_kept_engine_share_its_reward_workers_and_hold_the_same_rows(hf_pool, tmp_path):
    """A run's rounds (`KeptEngine`): each pool is scored by the same reward workers, idle between pools
    (the batch sampled past the last kept group is waited for, not dropped), and holds the rows that a
    pool started alone holds."""
    whole = pq.read_table(hf_pool)
    mixed = mixed_group_ids(whole)
    kept, workers = KeptEngine(), []

    def sample(name: str, first_prompt: int) -> pa.Table:
        kept_groups = {"keep_groups": 2, "first_prompt": first_prompt, "reward_workers": 1, **MIXED}
        config = hf_pool_config(tmp_path / name, **kept_groups)
        pool = generate_pool(config, engine=kept)
        scorer = kept.scorer(config)
        workers.append([process.pid for process in worker_processes(scorer._pool)])
        assert scorer.restarts == 0
        return pool

    try:
        first = sample("a.parquet", 0)
        second = sample("b.parquet", read_pool_info(first).counts.prompts)
    finally:
        kept.close()
    assert pq.read_table(first).equals(rows_of(whole, mixed[:2]))
    assert pq.read_table(second).equals(rows_of(whole, mixed[2:4]))
    assert workers[0] == workers[1] and len(workers[0]) == 1
