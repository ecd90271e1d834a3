"""Asynchronous training with `--off-policy-steps K`: each round sampled by the policy K updates before it
starts, the version stamped in its pool; the same seed gives the same bytes, a kill inside a round or
between rounds resumes to the uninterrupted run, the recorded rounds replay exactly, and K = 0 is
`--sync-every` itself."""

import csv
import json
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import REPO
from test_cli import GGPO, assert_one_error_line, ggpo_here
from test_sync_rounds import SMALL, _killed_at, _metrics, _same_weights, run_to_end

from ggpo_offline.compare.finished_runs import load_run
from ggpo_offline.compare.report import write_diagnostics
from ggpo_offline.core.model_io import weights_sha256
from ggpo_offline.pool.source import read_pool_info
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.metric_names import (
    AGE,
    AGE_MAX,
    AGE_MIN,
    MISMATCH_ESS,
    MISMATCH_K3,
    POLICY_ENTROPY,
    RESPONSE_LENGTH,
    ROUND_ENTROPY,
    ROUND_ESS,
    ROUND_INDEX,
    ROUND_K3,
    ROUND_LENGTH,
    k3_at_age,
    share_at_age,
)
from ggpo_offline.train.rounds import RoundSchedule, read_records
from ggpo_offline.train.trainer import train


@pytest.mark.parametrize(
    "updates, n, k, starts, versions",
    [
        (5, 1, 0, [0, 1, 2, 3, 4], [0, 1, 2, 3, 4]),  # Algorithm 1 at N = 1: each round its own start's
        (6, 2, 0, [0, 2, 4], [0, 2, 4]),
        (5, 1, 2, [0, 3, 4], [0, 1, 2]),  # update t sampled by θ_{t-2}; π0's pool serves t ≤ 2
        (10, 4, 1, [0, 4, 8], [0, 3, 7]),
        (10, 4, 5, [0, 8], [0, 3]),  # a round whose sampler would be π0 is the pool's
    ],
)
def test_the_schedule_samples_each_round_k_updates_before_it_starts(updates, n, k, starts, versions):
    schedule = RoundSchedule(updates, n, k)
    assert schedule.starts == starts
    assert [schedule.version(i) for i in range(len(starts))] == versions
    assert sum(schedule.round_updates(i) for i in range(len(starts))) == updates
    ages = [t - versions[max(i for i, s in enumerate(starts) if s <= t)] for t in range(updates)]
    assert all(age >= k for t, age in enumerate(ages) if t >= starts[1 % len(starts)])


def _command(pool: Path, out: Path) -> list[str]:
    """Four updates, each round sampled one update before it starts; no --save-every: the run keeps the
    checkpoints its samplers need by itself."""
    flags = "--method grpo-tis --updates 4 --sync-every 1 --off-policy-steps 1 --groups-per-batch 2 --lr 1e-4"
    return [*GGPO, "train", "--pool", str(pool), *flags.split(), "--seed", "1", "--threads", "1"] + [
        "--no-tracking",
        "--out",
        str(out),
    ]


ONE_RUN = pytest.mark.xdist_group("async-lag")


@pytest.fixture(scope="module")
def lagged(hf_pool, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lag") / "whole"
    return run_to_end(_command(hf_pool, out), out)


@ONE_RUN
def test_each_round_is_sampled_by_the_policy_k_updates_before_it_and_says_so(lagged):
    records = read_records(lagged / "rounds")
    assert [(r.index, r.start, len(r.plan)) for r in records] == [(0, 0, 2), (1, 2, 1), (2, 3, 1)]
    for record in records[1:]:
        checkpoint = lagged / "checkpoints" / f"update-{record.start - 1:06d}"
        info = read_pool_info(lagged / "rounds" / record.pool)
        assert record.sampled_by == str(checkpoint) and info.model.path == str(checkpoint)
        assert info.model.weights_sha256 == weights_sha256(checkpoint)  # the policy one update behind
        assert info.model.policy_version == record.start - 1  # stamped in the round's own pool
    assert [m[AGE] for m in _metrics(lagged)] == [0.0, 1.0, 1.0, 1.0]


@ONE_RUN
def test_a_round_is_measured_over_all_its_minibatches_on_the_policy_before_its_first_step(lagged):
    """Round 0 (two updates) by a forward of both its minibatches; rounds 1 and 2 (one update each) from
    their step's own forward, before the step: the same tokens and policy as the step's mismatch/*."""
    metrics = _metrics(lagged)
    assert [m.get(ROUND_INDEX) for m in metrics] == [0.0, None, 1.0, 2.0]
    first, second = metrics[0][RESPONSE_LENGTH], metrics[1][RESPONSE_LENGTH]
    assert first != second and metrics[0][ROUND_LENGTH] == pytest.approx((first + second) / 2, rel=1e-12)
    pairs = [(ROUND_K3, MISMATCH_K3), (ROUND_ESS, MISMATCH_ESS), (ROUND_ENTROPY, POLICY_ENTROPY)]
    for m in metrics[2:]:
        assert m[MISMATCH_K3] > 1e-6  # one update behind: a mismatch the measure must find
        for round_name, step_name in [*pairs, (ROUND_LENGTH, RESPONSE_LENGTH)]:
            assert m[round_name] == pytest.approx(m[step_name], rel=1e-6), round_name  # float32 sums


@ONE_RUN
def test_the_lagged_rounds_replay_through_another_learner_with_their_ages(lagged, tmp_path):
    recorded = json.loads((lagged / "result.json").read_text())
    replay = TrainConfig(pool=lagged / "rounds", method="grpo", updates=4, out=tmp_path / "replay", **SMALL)
    replayed = train(replay)
    assert replayed.fingerprints.data_order_fingerprint == recorded["data_order_fingerprint"]
    assert [m[AGE] for m in replayed.metrics] == [0.0, 1.0, 1.0, 1.0]  # read from the rounds' pools
    assert [m["train/reward"] for m in replayed.metrics] == [m["train/reward"] for m in _metrics(lagged)]


@pytest.mark.parametrize(
    "updates, k, shares",
    [
        (6, 2, {2: [(1, 0), (0, 0)], 3: [(2, 0), (1, 1)], 5: [(4, 0), (3, 1)]}),
        (6, 3, {2: [(1, 0), (0, 0), (0, 1)], 3: [(2, 0), (1, 1), (0, 2)], 4: [(3, 0), (2, 1), (1, 2)]}),
    ],
)
def test_a_mixed_lag_holds_one_share_of_each_of_the_k_versions_before_the_update(updates, k, shares):
    schedule = RoundSchedule(updates, 1, k, mixed=True)
    assert schedule.starts == [0, *range(2, updates)]  # round 0: the pool's two updates
    for update, expected in shares.items():
        assert schedule.shares(update) == expected  # (version, its share): the pool's shares in turn
    used = [(v, part) for t in schedule.starts[1:] for v, part in schedule.shares(t) if v > 0]
    assert sorted(used) == [(v, p) for v in range(1, updates - 1) for p in range(schedule.sampled_shares(v))]
    assert schedule.pool_shares == k * (k - 1) // 2 and schedule.sampled_shares(updates - 2) == 1


def _mixed_command(pool: Path, out: Path) -> list[str]:
    return [*_command(pool, out), "--off-policy-steps", "2", "--lag", "mixed"]


@pytest.fixture(scope="module")
def mixed(hf_pool, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mixed") / "whole"
    return run_to_end(_mixed_command(hf_pool, out), out)


@ONE_RUN
def test_a_mixed_lag_minibatch_holds_groups_of_ages_1_to_k_each_stamped(hf_pool, mixed):
    """G = 2, K = 2: update t holds one group sampled by version t − 1 and one by t − 2 (the pool's for
    versions ≤ 0); each round's pool names every group's version; the run logs the ages and K3 by age."""
    records = read_records(mixed / "rounds")
    assert [(r.start, len(r.plan)) for r in records] == [(0, 2), (2, 1), (3, 1)]
    pool_groups = set(pq.read_table(hf_pool, columns=["group_id"]).column("group_id").to_pylist())
    for record in records[1:]:
        versions = read_pool_info(mixed / "rounds" / record.pool).model.group_versions
        assert sorted(versions.values()) == sorted([record.start - 1, max(record.start - 2, 0)])
        for group, version in versions.items():
            sample = hf_pool if version == 0 else mixed / "rounds" / f"sampled-{version:04d}.parquet"
            held = set(pq.read_table(sample, columns=["group_id"]).column("group_id").to_pylist())
            assert int(group) in held
            if version > 0:
                checkpoint = mixed / "checkpoints" / f"update-{version:06d}"
                assert read_pool_info(sample).model.weights_sha256 == weights_sha256(checkpoint)
    groups = [g for r in records for row in r.plan for g in row]
    assert len(groups) == len(set(groups)) and len(set(groups) & pool_groups) == 5  # each used once
    metrics = _metrics(mixed)
    assert [(m[AGE_MIN], m[AGE_MAX]) for m in metrics] == [(0.0, 0.0), (1.0, 1.0), (1.0, 2.0), (1.0, 2.0)]
    assert all(k3_at_age(1) in m and k3_at_age(2) in m for m in metrics[2:])
    assert all((m[share_at_age(1)], m[share_at_age(2)]) == (0.5, 0.5) for m in metrics[2:])  # histogram
    assert not any(k3_at_age(1) in m or share_at_age(1) in m for m in metrics[:2])  # one age: policy/age


@ONE_RUN
def test_a_compares_diagnostics_carry_each_updates_ages_histogram_and_k3_by_age(mixed, tmp_path):
    write_diagnostics([load_run(mixed, "grpo-tis", 1)], tmp_path / "diagnostics.csv")
    with (tmp_path / "diagnostics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    by_age = [share_at_age(1), share_at_age(2), k3_at_age(1), k3_at_age(2)]
    assert list(rows[0])[-4:] == by_age  # the histogram, then the K3 by age, each by age
    for row, logged in zip(rows, _metrics(mixed), strict=True):
        assert [row[name] for name in by_age] == [str(logged.get(name, "")) for name in by_age]


@ONE_RUN
def test_killed_inside_a_round_and_between_rounds_it_resumes_to_the_same_bytes(hf_pool, mixed, tmp_path):
    """Kill -9 inside round 1 (sampled and assembled, its update not done), resume; kill -9 where version 2
    is about to sample, resume: the same round rows, metrics and weights as the run never killed (same
    seed, same bytes). Then its recorded rounds replay through another learner on exactly its minibatches."""
    cut = tmp_path / "cut"
    _killed_at(_mixed_command(hf_pool, cut), "0:training update 2", tmp_path / "first.log")
    assert (cut / "rounds" / "round-0001.parquet").exists()
    resume = [*_mixed_command(hf_pool, cut), "--resume"]
    _killed_at(resume, "0:sampling round 2 with the checkpoint of update 2", tmp_path / "second.log")
    finished = subprocess.run(resume, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr
    assert (mixed / "metrics.jsonl").read_text() == (cut / "metrics.jsonl").read_text()
    assert _same_weights(mixed, cut)
    for a, b in zip(read_records(mixed / "rounds"), read_records(cut / "rounds"), strict=True):
        assert (a.plan, a.next_prompt) == (b.plan, b.next_prompt)
        if a.index > 0:
            assert pq.read_table(mixed / "rounds" / a.pool).equals(pq.read_table(cut / "rounds" / b.pool))

    recorded = json.loads((mixed / "result.json").read_text())
    replay = TrainConfig(pool=mixed / "rounds", method="grpo", updates=4, out=tmp_path / "replay", **SMALL)
    replayed = train(replay)
    assert replayed.fingerprints.data_order_fingerprint == recorded["data_order_fingerprint"]
    whole = _metrics(mixed)
    assert [m[AGE] for m in replayed.metrics] == [m[AGE] for m in whole]  # from the pools' stamps
    assert [m["train/reward"] for m in replayed.metrics] == [m["train/reward"] for m in whole]
    assert all(k3_at_age(2) in m for m in replayed.metrics[2:])


def test_zero_off_policy_steps_is_sync_every_itself_bit_for_bit(hf_pool, tmp_path):
    base = {"pool": hf_pool, "method": "grpo", "updates": 2, "sync_every": 1, **SMALL}
    runs = [
        train(TrainConfig(**base, out=tmp_path / name, **k))
        for name, k in (("sync", {}), ("lag0", {"off_policy_steps": 0}))
    ]
    assert runs[0].metrics == runs[1].metrics and _same_weights(runs[0].run_dir, runs[1].run_dir)
    assert [m[AGE] for m in runs[0].metrics] == [0.0, 0.0]  # each update's own policy sampled it


def test_off_policy_steps_refusals_are_one_line(hf_pool, tmp_path):
    base = ["train", "--pool", str(hf_pool), "--updates", "4", "--groups-per-batch", "2"]
    for flags, words in [
        (["--off-policy-steps", "1"], "--off-policy-steps set how --sync-every samples its rounds: give"),
        (["--sync-every", "2", "--off-policy-steps", "1", "--lag", "mixed"], "give it with --sync-every 1"),
        (["--sync-every", "1", "--off-policy-steps", "3", "--lag", "mixed"], "--groups-per-batch 2 is not"),
        (
            ["--sync-every", "1", "--off-policy-steps", "3", "--lag", "mixed", "--groups-per-batch", "3"],
            "--lag mixed takes 9 mixed-reward groups of the pool (round 0's updates and the shares",
        ),
        (
            ["--sync-every", "1", "--off-policy-steps", "4"],
            "--off-policy-steps must be in 0..3 (--updates - 1)",
        ),
        (["--sync-every", "1", "--off-policy-steps", "-1"], "--off-policy-steps must be >= 0, got -1"),
    ]:
        out = tmp_path / "run"
        assert_one_error_line(ggpo_here(*base, "--out", str(out), *flags), words)
        assert not out.exists()
