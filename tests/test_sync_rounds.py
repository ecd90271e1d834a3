"""`ggpo train --sync-every N` (Algorithm 1): every N updates the current policy samples the next round,
recorded as a pool in the run folder; N = U is the offline run, bit for bit; a run killed inside a round or
between rounds resumes to the uninterrupted one; its recorded rounds replay through another learner."""

import csv
import dataclasses
import json
import math
import os
import signal
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from conftest import REPO, stopped_itself
from safetensors.torch import load_file
from test_cli import GGPO, assert_one_error_line, ggpo_here

from ggpo_offline.compare.finished_runs import load_run
from ggpo_offline.compare.report import write_diagnostics
from ggpo_offline.core.errors import UserError
from ggpo_offline.core.model_io import weights_sha256
from ggpo_offline.pool.info import PoolDataset
from ggpo_offline.pool.source import read_pool_info
from ggpo_offline.pool.writer import PoolWriter
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.distributed import STOP_VARIABLE
from ggpo_offline.train.metric_names import ROUND_INDEX, ROUND_K3, ROUND_METRICS
from ggpo_offline.train.rounds import MANIFEST, read_records
from ggpo_offline.train.run_folder import RunFolder
from ggpo_offline.train.trainer import train

SMALL = {
    "groups_per_batch": 2,
    "lr": 1e-4,
    "seed": 1,
    "no_tracking": True,
}  # torch's threads: a test process's own


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "final" / "model.safetensors"))


def _same_weights(a: Path, b: Path) -> bool:
    first, second = _weights(a), _weights(b)
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize(
    "method, changes",
    [("grpo-tis", {"tis_block": 2}), ("ggpo", {"ref_refresh": 2})],
    ids=["grpo-tis", "ggpo"],
)
def test_sync_every_u_is_the_offline_run_bit_for_bit(hf_pool, tmp_path, method, changes):
    """The far end of the ladder: one round, the given pool, replayed as an offline run replays it (π_old
    blocks and π_ref refreshes inside it included)."""
    runs = {
        sync: train(
            TrainConfig(
                pool=hf_pool,
                method=method,
                updates=3,
                sync_every=sync,
                out=tmp_path / str(sync),
                **SMALL,
                **changes,
            )
        )
        for sync in (None, 3)
    }
    offline, synced = runs[None], runs[3]
    assert _same_weights(offline.run_dir, synced.run_dir)
    assert offline.fingerprints == synced.fingerprints
    assert [m[ROUND_INDEX] for m in synced.metrics if ROUND_INDEX in m] == [0.0]
    trained = [{k: v for k, v in m.items() if not k.startswith("round/")} for m in synced.metrics]
    assert trained == offline.metrics
    assert not (synced.run_dir / "rounds" / "round-0001.parquet").exists()


def _command(pool: Path, out: Path) -> list[str]:
    flags = (
        "--method grpo-tis --updates 3 --sync-every 1 --groups-per-batch 2 --lr 1e-4 --seed 1 --save-every 1"
    )
    return [
        *GGPO,
        "train",
        "--pool",
        str(pool),
        *flags.split(),
        "--threads",
        "1",
        "--no-tracking",
        "--out",
        str(out),
    ]


def _killed_at(command: list[str], point: str, log: Path) -> None:
    with log.open("w") as output:
        job = subprocess.Popen(
            command, cwd=REPO, env={**os.environ, STOP_VARIABLE: point}, stdout=output, stderr=output
        )
        stopped_itself(job, log)
        os.kill(job.pid, signal.SIGKILL)
        job.wait()


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


ONE_RUN = pytest.mark.xdist_group("sync-rounds")
"""The tests on `uninterrupted` share a pytest-xdist worker (make test's loadgroup): it is trained once."""


def run_to_end(command: list[str], out: Path) -> Path:
    """``command``, which writes the run folder ``out``, run to its end without a stop."""
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def uninterrupted(hf_pool, tmp_path_factory) -> Path:
    """`_command` run to its end without a stop: --sync-every 1, three rounds, a checkpoint every update."""
    whole = tmp_path_factory.mktemp("sync") / "whole"
    return run_to_end(_command(hf_pool, whole), whole)


@ONE_RUN
def test_sync_every_1_trains_each_update_on_samples_of_the_checkpoint_before_it(hf_pool, uninterrupted):
    folder = uninterrupted / "rounds"
    records = read_records(folder)
    assert [(r.index, r.start, len(r.plan)) for r in records] == [(i, i, 1) for i in range(3)]
    seen = set(range(read_pool_info(hf_pool).counts.prompts))  # the given pool's prompts
    for record in records[1:]:
        pool = folder / record.pool
        info = read_pool_info(pool)
        checkpoint = uninterrupted / "checkpoints" / f"update-{record.start:06d}"
        assert record.sampled_by == str(checkpoint) and info.model.path == str(checkpoint)
        assert info.model.weights_sha256 == weights_sha256(checkpoint)  # the weights it had at that update
        ids = set(pq.read_table(pool, columns=["group_id"]).column("group_id").to_pylist())
        assert len(ids) == 2 and not ids & seen and min(ids) > max(seen)  # the next prompts, N x G groups
        assert sorted(g for row in record.plan for g in row) == sorted(ids)
        seen |= ids
    assert records[-1].next_prompt == max(seen) + 1
    # The hf engine in float32 computes the learner's log-probs up to float rounding (K3 ~1e-13): a round's
    # behavior log-probs are those of the policy at the update that trains on it, and of no other (one update
    # at this lr moves K3 by ~1e-4).
    metrics = _metrics(uninterrupted)
    assert [m[ROUND_INDEX] for m in metrics] == [0.0, 1.0, 2.0]
    assert all(m[ROUND_K3] < 1e-9 for m in metrics)
    # Each sampled round's profile: the engine, sampling, scoring and writing (timed in the engine's
    # process), and its index, as phases of their own; the given pool's round 0 has none.
    sampled = ["round_engine", "round_sampling", "round_scoring", "round_writing", "round_index"]
    phases = [(t.phase, t.update) for t in RunFolder(uninterrupted).read_profile() if t.phase in sampled]
    assert sorted(phases) == sorted((phase, update) for phase in sampled for update in (1, 2))


@ONE_RUN
def test_the_rounds_manifest_carries_its_format_and_reads_the_one_before(uninterrupted, tmp_path):
    """rounds.json is {"format": 2, "rounds": [...]}; a format-1 file (no key, the run's settings beside
    the rounds) reads the same, and a format this version does not know is one line."""
    stored = json.loads((uninterrupted / "rounds" / MANIFEST).read_text())
    assert list(stored) == ["format", "rounds"] and stored["format"] == 2
    records = read_records(uninterrupted / "rounds")
    older = {"sync_every": 1, "groups_per_batch": 2, "updates": 3, "rounds": stored["rounds"]}
    (tmp_path / MANIFEST).write_text(json.dumps(older))
    assert read_records(tmp_path) == records
    (tmp_path / MANIFEST).write_text(json.dumps({**stored, "format": 3}))
    with pytest.raises(UserError) as refused:
        read_records(tmp_path)
    assert str(refused.value) == f"{tmp_path / MANIFEST} has format 3; this ggpo-offline reads format 1, 2"


@ONE_RUN
def test_a_compares_diagnostics_carry_the_rounds_and_their_n(uninterrupted, tmp_path):
    """What `ggpo ladder-report` reads instead of the runs: every row names N, each round's first update
    its round's measures, as the run logged them."""
    record = load_run(uninterrupted, "grpo-tis", 1)
    write_diagnostics([record], tmp_path / "diagnostics.csv")
    with (tmp_path / "diagnostics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {row["sync_every"] for row in rows} == {"1"}
    logged = {int(m["update"]): m for m in _metrics(uninterrupted) if ROUND_INDEX in m}
    assert sorted(logged) == [0, 1, 2]
    for row in rows:
        metrics = logged.get(int(row["update"]), {})
        for name in (ROUND_INDEX, *ROUND_METRICS):
            assert row[name] == (str(metrics[name]) if metrics else ""), (row["update"], name)


@ONE_RUN
def test_killed_inside_a_round_and_between_rounds_it_resumes_to_the_uninterrupted_run(
    hf_pool, uninterrupted, tmp_path
):
    """Kill -9 inside round 1 (sampled, its update not done), resume; kill -9 where round 2 is about to be
    sampled, resume: the same round pools, metrics and weights as the run never killed. Then its recorded
    rounds replay through another learner on exactly its minibatches."""
    whole, cut = uninterrupted, tmp_path / "cut"
    _killed_at(_command(hf_pool, cut), "0:training update 1", tmp_path / "first.log")
    assert (cut / "rounds" / "round-0001.parquet").exists()
    assert not (cut / "checkpoints" / "update-000002").exists()
    resume = [*_command(hf_pool, cut), "--resume"]
    _killed_at(resume, "0:sampling round 2 with the checkpoint of update 2", tmp_path / "second.log")
    assert len(json.loads((cut / "rounds" / MANIFEST).read_text())["rounds"]) == 2
    finished = subprocess.run(resume, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr
    assert (whole / "metrics.jsonl").read_text() == (cut / "metrics.jsonl").read_text()
    assert _same_weights(whole, cut)
    for a, b in zip(read_records(whole / "rounds"), read_records(cut / "rounds"), strict=True):
        assert (a.plan, a.next_prompt) == (b.plan, b.next_prompt)
        if a.index > 0:  # the same rows; the footers differ by when and where they were written
            assert pq.read_table(whole / "rounds" / a.pool).equals(pq.read_table(cut / "rounds" / b.pool))
    recorded = json.loads((whole / "result.json").read_text())

    replay = TrainConfig(pool=whole / "rounds", method="grpo", updates=3, out=tmp_path / "replay", **SMALL)
    replayed = train(replay)
    assert replayed.fingerprints.data_order_fingerprint == recorded["data_order_fingerprint"]
    assert replayed.fingerprints.pool_fingerprint == recorded["pool_fingerprint"]
    assert [m["train/reward"] for m in replayed.metrics] == [m["train/reward"] for m in _metrics(whole)]


@ONE_RUN
def test_each_learner_family_replays_the_recorded_rounds_on_their_minibatches(uninterrupted, tmp_path):
    """Beside GRPO+TIS (sampled), GGPO (N = U) and GRPO (the kill test's replay): a clipped and an unclipped
    learner with a reference, a masking and a bypass correction, each entering the three rounds (π_ref and
    behavior log-probs of each) on exactly the recorded minibatches."""
    recorded = json.loads((uninterrupted / "result.json").read_text())
    rewards = [m["train/reward"] for m in _metrics(uninterrupted)]
    for method in ("ggpo-clip", "agro", "trl-sequence-mask", "verl-bypass-pg-is"):
        replay = TrainConfig(
            pool=uninterrupted / "rounds", method=method, updates=3, out=tmp_path / method, **SMALL
        )
        result = train(replay)
        assert result.fingerprints.data_order_fingerprint == recorded["data_order_fingerprint"], method
        assert [m[ROUND_INDEX] for m in result.metrics if ROUND_INDEX in m] == [0.0, 1.0, 2.0], method
        assert all(math.isfinite(v) for m in result.metrics for v in m.values()), method
        assert [m["train/reward"] for m in result.metrics] == rewards, method


def _imported_copy(pool: Path, out: Path) -> Path:
    """``pool`` as an import records it: no generate-pool settings, no dataset to sample again."""
    info = read_pool_info(pool)
    footer = dataclasses.replace(info, config=None, dataset=PoolDataset(spec="imported:generic"))
    with PoolWriter(out, overwrite=True) as writer:
        writer.write_table(pq.read_table(pool))
        writer.close(footer)
    return out


def test_refusals_are_one_line_and_write_nothing(hf_pool, tmp_path):
    few = tmp_path / "few.jsonl"
    few.write_text(
        "".join(json.dumps({"problem": f"{n} + 1", "answer": str(n + 1)}) + "\n" for n in range(3))
    )
    cases = [
        (["--sync-every", "0"], "--sync-every must be >= 1, got 0"),
        (["--sync-every", "5"], "--sync-every must be in 1..4 (--updates), got 5"),
        (["--behavior-logprobs", "learner"], "give --sync-every"),
        (["--sync-every", "1", "--sync-dataset", str(few)], f"but {few} has 3 after prompt 0"),
    ]
    for flags, words in cases:
        out = tmp_path / "run"
        result = ggpo_here(
            "train",
            "--pool",
            str(hf_pool),
            "--updates",
            "4",
            "--groups-per-batch",
            "2",
            "--out",
            str(out),
            *flags,
        )
        assert_one_error_line(result, words)
        assert not out.exists()
    imported = _imported_copy(hf_pool, tmp_path / "imported.parquet")
    result = ggpo_here(
        "train", "--pool", str(imported), "--updates", "4", "--groups-per-batch", "2", "--sync-every", "2",
        "--out", str(out),
    )  # fmt: skip
    assert_one_error_line(result, "records no dataset to sample rounds from (dataset imported:generic): give")
    assert "--sync-dataset" in result.stderr and not out.exists()


def test_dry_run_shows_the_rounds_and_what_sampling_them_costs(hf_pool, tmp_path):
    result = ggpo_here(
        "train", "--pool", str(hf_pool), "--updates", "6", "--groups-per-batch", "2", "--sync-every", "2",
        "--dry-run", "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (
        "rounds: 3 of 2 updates; round 0 is the pool, rounds 1..2 are sampled by the checkpoints"
        in result.stdout
    )
    assert "sampling: 4 mixed groups a round from arith:train (prompt 16 on)" in result.stdout
    # 6 of the pool's 16 groups mixed: 4 groups need ceil(4 / 0.375) = 11 prompts; the engine samples the
    # window, ceil(1.25 x 11) + 2 = 16, all in one of its 256-prompt batches.
    assert "about 11 prompts each at the pool's mixed rate 38%, 16 sampled" in result.stdout
    assert not (tmp_path / "run").exists()


@ONE_RUN
def test_two_processes_sample_and_train_the_rounds_as_one_process_does(hf_pool, uninterrupted, tmp_path):
    """--nproc 2: rank 0 samples each round while the other waits, then each trains its share of it. Two
    updates (one sampled round) against the first two of the one-process run and its checkpoint there."""
    two = tmp_path / "two"
    command = [*_command(hf_pool, two), "--nproc", "2"]
    command[command.index("--updates") + 1] = "2"
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    one_series, two_series = _metrics(uninterrupted)[:2], _metrics(two)
    assert [r["update"] for r in two_series] == [0, 1]
    for a, b in zip(one_series, two_series, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (a["update"], key, a[key], b[key])
    assert [r.plan for r in read_records(two / "rounds")] == [
        r.plan for r in read_records(uninterrupted / "rounds")[:2]
    ]
    one_weights = load_file(str(uninterrupted / "checkpoints" / "update-000002" / "model.safetensors"))
    two_weights = _weights(two)
    for name in one_weights:
        torch.testing.assert_close(two_weights[name], one_weights[name], atol=5e-5, rtol=0)


def _mismatched_copy(pool: Path, out: Path) -> Path:
    """``pool`` with its behavior log-probs 0.05 below the sampler's, whose rounds an hf engine samples in
    bfloat16: an engine that does not compute what the float32 learner computes, in every round."""
    import pyarrow as pa

    table = pq.read_table(pool)
    shifted = [[value - 0.05 for value in row] for row in table.column("behavior_logprobs").to_pylist()]
    column = table.schema.get_field_index("behavior_logprobs")
    field = table.schema.field(column)
    table = table.set_column(column, field, pa.array(shifted, field.type))
    info = read_pool_info(pool)
    with PoolWriter(out, overwrite=True) as writer:
        writer.write_table(table)
        writer.close(dataclasses.replace(info, config={**info.config, "dtype": "bfloat16"}))
    return out


def test_learner_behavior_logprobs_remove_the_engines_mismatch_from_every_round(hf_pool, tmp_path):
    """--behavior-logprobs learner, the control without training-inference mismatch: each round (the given
    pool and the sampled ones) is trained against the learner's own log-probs on the checkpoint that sampled
    it instead of the engine's."""
    from ggpo_offline.train.minibatch import MinibatchReader
    from ggpo_offline.train.pi0_cache import ensure_pi0_cache
    from ggpo_offline.train.pool_index import check_pool

    pool = _mismatched_copy(hf_pool, tmp_path / "mismatched.parquet")
    config = TrainConfig(
        pool=pool, method="grpo-tis", updates=2, sync_every=1, behavior_logprobs="learner",
        out=tmp_path / "run", **SMALL,
    )  # fmt: skip
    metrics = train(config).metrics
    assert [m[ROUND_INDEX] for m in metrics] == [0.0, 1.0]
    assert all(m[ROUND_K3] < 1e-9 for m in metrics)
    for round_pool, sampler in ((pool, None), (config.run_dir / "rounds" / "round-0001.parquet", 1)):
        checked = check_pool(round_pool)
        groups = checked.index.mixed_group_ids[:2].tolist()
        batch = MinibatchReader(round_pool, checked.index, pad_id=0).read(groups)
        model = None if sampler is None else str(config.run_dir / "checkpoints" / f"update-{sampler:06d}")
        learner = ensure_pi0_cache(round_pool, model)[1].logprobs(batch)
        assert ((batch.behavior_logp - learner) * batch.mask).abs().max().item() > 1e-3  # what it took away


class _Crash(Exception):
    """Stands in for a kill after the first stored batch."""


def _crash(progress) -> None:
    raise _Crash


def test_a_round_whose_window_holds_too_few_mixed_groups_is_widened_to_the_same_pool(tmp_path):
    """A policy that learns leaves fewer mixed groups per prompt than the pool had: the round's window is
    doubled until it holds them, giving the pool a wide enough window gives; a kill inside a widened window
    resumes its stored batches; a dataset with no more prompts is one line."""
    from conftest import hf_pool_config

    from ggpo_offline.generate.pipeline import TooFewGroups, generate_pool
    from ggpo_offline.generate.resample import sample_round

    def config(out, prompts, **changes):
        settings = {"first_prompt": 16, "keep_groups": 1, "mixed_only": True, "batch_prompts": 1}
        return hf_pool_config(out, num_prompts=16 + prompts, **(settings | changes))

    wide = generate_pool(config(tmp_path / "wide.parquet", 32))
    round_ = sample_round(config(tmp_path / "widened.parquet", 1), engine=None)
    widened = round_.path
    assert pq.read_table(widened).equals(pq.read_table(wide))
    assert read_pool_info(widened).dataset.other["limit"] > 17  # it did widen
    assert sorted(round_.seconds) == ["sampling", "scoring", "writing"]  # each window's, for the profile
    killed = tmp_path / "killed.parquet"
    with pytest.raises(_Crash):
        generate_pool(config(killed, read_pool_info(widened).dataset.other["limit"] - 16), on_batch=_crash)
    assert pq.read_table(sample_round(config(killed, 1), engine=None).path).equals(pq.read_table(wide))
    few = tmp_path / "few.jsonl"
    few.write_text(json.dumps({"problem": "1 + 1", "answer": "2"}) + "\n")
    with pytest.raises(TooFewGroups):  # 1 prompt, 2 groups asked: widened past the dataset's end, refused
        sample_round(
            hf_pool_config(tmp_path / "no.parquet", dataset=str(few), num_prompts=1, keep_groups=2), None
        )


def test_a_sampler_warmed_before_its_first_round_samples_what_a_cold_one_does(hf_pool, tmp_path):
    """The rounds' sampling process starts its engine while the run trains towards round 1
    (`RemoteSampler.warm`): the round's pool is the one an engine started for it samples, and a warm-up
    that fails is the next request's one line, not a lost answer."""
    from conftest import hf_pool_config

    from ggpo_offline.generate.resample import RemoteSampler

    warmed = RemoteSampler(timeout_s=600)
    try:
        warmed.warm(hf_pool_config(tmp_path / "unused.parquet"))
        sampled = warmed.sample(hf_pool_config(tmp_path / "round.parquet")).path
    finally:
        warmed.close()
    columns = ["group_id", "prompt_token_ids", "response_token_ids", "reward"]
    assert pq.read_table(sampled, columns=columns).equals(pq.read_table(hf_pool, columns=columns))
    assert not (tmp_path / "unused.parquet").exists()

    failing = RemoteSampler(timeout_s=600)
    try:
        failing.warm(hf_pool_config(tmp_path / "unused.parquet", dataset="arith:nosuchsplit"))
        with pytest.raises(UserError, match="nosuchsplit"):
            failing.sample(hf_pool_config(tmp_path / "round.parquet"))
    finally:
        failing.close()
