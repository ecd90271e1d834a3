"""Interrupted runs resume: generate-pool from its durable parts, train from its last checkpoint, each
ending with what the uninterrupted run gives."""

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from conftest import REPO, hf_pool_config
from test_cli import GGPO, assert_one_error_line, ggpo_here

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.one_writer import one_writer
from ggpo_offline.generate.engines import SamplingSettings
from ggpo_offline.generate.pipeline import GenerateConfig, generate_pool
from ggpo_offline.pool.partial import PROGRESS_FILE, StoredProgress, partial_dir
from ggpo_offline.pool.source import read_pool_info


class Crash(Exception):
    """Stands in for a crash after some batches were stored."""


def hf_config(out, seed=3, num_prompts=12, **changes) -> GenerateConfig:
    settings = {"num_prompts": num_prompts, "sampling": SamplingSettings(m=2, max_tokens=24, seed=seed)}
    return hf_pool_config(out, **(settings | {"batch_prompts": 4} | changes))


def crash_after(batches: int):
    def on_batch(progress) -> None:
        if progress.prompts_done - progress.prompts_resumed >= 4 * batches:
            raise Crash

    return on_batch


def parts(out) -> list[str]:
    return [p["file"] for p in json.loads((partial_dir(out) / PROGRESS_FILE).read_text())["parts"]]


def test_the_progress_record_reads_as_its_type_and_another_version_is_one_line(tmp_path):
    """progress.json is a `StoredProgress` of `StoredPart`s whose counts sum to what was stored; one of a
    version this one does not read is refused in one line, and its parts stay."""
    out = tmp_path / "p.parquet"
    with pytest.raises(Crash):
        generate_pool(hf_config(out), on_batch=crash_after(2))
    stored = StoredProgress.read(out)
    assert [part.file for part in stored.parts] == ["part-000000.parquet", "part-000001.parquet"]
    assert [part.rows for part in stored.parts] == [8, 8] and stored.totals.prompts_done == 8
    assert stored.totals.responses == 16 and 0 <= stored.totals.reward_sum <= 16
    record = json.loads((partial_dir(out) / PROGRESS_FILE).read_text())
    (partial_dir(out) / PROGRESS_FILE).write_text(json.dumps({**record, "version": 2}))
    with pytest.raises(UserError) as refused:
        generate_pool(hf_config(out))
    state = partial_dir(out)
    assert str(refused.value) == (
        f"{state / PROGRESS_FILE} is unreadable (version 2, expected 1); delete {state} to start over"
    )
    assert sorted(p.name for p in partial_dir(out).glob("part-*")) == [
        "part-000000.parquet",
        "part-000001.parquet",
    ]


def test_a_crashed_run_resumes_and_ends_with_the_uninterrupted_pool(tmp_path):
    whole = generate_pool(hf_config(tmp_path / "whole.parquet"))
    out = tmp_path / "resumed.parquet"
    with pytest.raises(Crash):
        generate_pool(hf_config(out), on_batch=crash_after(2))
    assert not out.exists() and parts(out) == ["part-000000.parquet", "part-000001.parquet"]

    # The same command typed while another still writes (or a Slurm task requeued while its predecessor is
    # being killed) is refused with one line naming the holder, and the stored parts stay as they were.
    state, stored = partial_dir(out), (partial_dir(out) / PROGRESS_FILE).read_bytes()
    with one_writer(state), pytest.raises(UserError) as refused:  # held as a running generate-pool holds it
        generate_pool(hf_config(out))
    assert str(refused.value) == (
        f"{state} is being written by pid {os.getpid()} on {socket.gethostname()}; {out} has one "
        "generate-pool: let it finish (or stop it), then run it again"
    )
    assert (state / PROGRESS_FILE).read_bytes() == stored and not out.exists()

    seen = []
    generate_pool(hf_config(out), on_batch=lambda p: seen.append((p.prompts_resumed, p.prompts_done)))
    assert seen == [(8, 12)]  # only the third batch was sampled again
    assert pq.read_table(out).equals(pq.read_table(whole))
    assert pq.ParquetFile(out).num_row_groups == pq.ParquetFile(whole).num_row_groups == 3
    meta, expected = read_pool_info(out).raw, read_pool_info(whole).raw
    assert meta["counts"] == expected["counts"] and meta["reward"] == expected["reward"]
    assert not partial_dir(out).exists()


def test_a_changed_command_refuses_to_resume_and_names_the_difference(tmp_path):
    out = tmp_path / "pool.parquet"
    with pytest.raises(Crash):
        generate_pool(hf_config(out), on_batch=crash_after(1))
    before = {p.name: p.read_bytes() for p in partial_dir(out).iterdir()}
    with pytest.raises(
        UserError, match=r"differ in .*; seed \(3 -> 4\)\); rerun that command .* pass --overwrite"
    ):
        generate_pool(hf_config(out, seed=4))
    with pytest.raises(UserError, match=r"differ in dataset.limit \(12 -> 8\); dataset.num_problems"):
        generate_pool(hf_config(out, num_prompts=8))
    assert {p.name: p.read_bytes() for p in partial_dir(out).iterdir()} == before
    # Batch size and reward workers do not change a prompt's rows: the run resumes.
    generate_pool(hf_config(out, batch_prompts=8, reward_workers=1))
    assert read_pool_info(out).raw["counts"]["prompts"] == 12

    with pytest.raises(Crash):
        generate_pool(hf_config(tmp_path / "b.parquet", num_prompts=4), on_batch=crash_after(1))
    # --overwrite starts over instead of refusing
    fresh = generate_pool(hf_config(tmp_path / "b.parquet", seed=4, num_prompts=4, overwrite=True))
    assert read_pool_info(fresh).raw["sampling"]["seed"] == 4 and not partial_dir(fresh).exists()


@pytest.mark.kill
def test_kill_9_then_rerun_gives_the_uninterrupted_pool(tmp_path):
    out = tmp_path / "p.parquet"
    args = "generate-pool --engine hf --num-prompts 24 --batch-prompts 4 -m 2 --max-tokens 16 --seed 5"
    args = [*args.split(), "--reward-workers", "0", "--out", str(out)]
    process = subprocess.Popen(GGPO + args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (partial_dir(out) / PROGRESS_FILE).exists():
        assert process.poll() is None and time.monotonic() < deadline, "no part was stored"
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not out.exists()
    done = len(parts(out))
    assert 1 <= done < 6

    resumed = subprocess.run(GGPO + args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming: {4 * done} of 24 prompts were done" in resumed.stderr
    sampling = SamplingSettings(m=2, max_tokens=16, seed=5)
    whole = generate_pool(
        hf_config(tmp_path / "whole.parquet", num_prompts=24, dtype="auto", sampling=sampling)
    )
    assert pq.read_table(out).equals(pq.read_table(whole))
    groups = pq.read_table(out, columns=["group_id"]).column("group_id").to_pylist()
    assert sorted(set(groups)) == list(range(24)) and len(groups) == 48  # none lost, none twice
    assert not partial_dir(out).exists()


def test_cli_refusal_of_a_changed_command_is_one_line(tmp_path):
    out = tmp_path / "p.parquet"
    with pytest.raises(Crash):
        generate_pool(hf_config(out, dtype="auto", reward_workers=0), on_batch=crash_after(1))
    args = ["generate-pool", "--engine", "hf", "--num-prompts", "12", "--batch-prompts", "4", "-m", "2"]
    args += ["--max-tokens", "16", "--seed", "3", "--reward-workers", "0", "--out", str(out)]
    assert_one_error_line(ggpo_here(*args), "differ in max_tokens (24 -> 16)")


@pytest.mark.kill
def test_kill_9_of_training_then_resume_gives_the_uninterrupted_metrics_and_weights(vllm_pool, tmp_path):
    from safetensors.torch import load_file

    def command(out) -> list[str]:
        flags = "--method ggpo --updates 10 --groups-per-batch 2 --lr 1e-4 --ref-refresh 3 --save-every 2"
        return [*GGPO, "train", "--pool", str(vllm_pool), *flags.split(), "--no-tracking", "--out", str(out)]

    whole = subprocess.run(command(tmp_path / "whole"), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr
    cut = tmp_path / "cut"
    process = subprocess.Popen(command(cut), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = cut / "checkpoints" / "update-000002" / "trainer_state.pt"
    deadline = time.monotonic() + 120
    while not first.exists():
        assert process.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (cut / "final").exists()  # it really died mid-run

    resumed = subprocess.run(
        [*command(cut), "--resume"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr
    series = [(tmp_path / run / "metrics.jsonl").read_text() for run in ("whole", "cut")]
    assert series[0] == series[1]  # bitwise: the same JSON text, update by update, none repeated
    a, b = (load_file(str(tmp_path / run / "final" / "model.safetensors")) for run in ("whole", "cut"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_if_any_carries_a_run_on_from_whatever_state_its_folder_is_in(vllm_pool, tmp_path):
    """What every launcher's job runs (`ggpo train --resume-if-any`), so that a requeued job resumes: an
    empty folder is trained, a finished run left as it is, a run stopped after a checkpoint resumed from it
    and one stopped before any replaced; each ends as the uninterrupted run. A folder holding another run is
    refused with one line, as is the flag beside --resume."""
    flags = "--method ggpo --updates 4 --groups-per-batch 2 --save-every 2 --no-tracking --threads 1".split()

    def train(out, *more: str, lr: str = "1e-4"):
        return ggpo_here("train", "--pool", str(vllm_pool), *flags, "--lr", lr, "--out", str(out), *more)

    whole = tmp_path / "whole"
    assert train(whole, "--resume-if-any").returncode == 0
    finished = {p: p.stat().st_mtime_ns for p in whole.rglob("*") if p.is_file()}
    again = train(whole, "--resume-if-any")
    assert again.returncode == 0 and f"{whole} holds this run, finished: nothing to train" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in whole.rglob("*") if p.is_file()} == finished

    for update in (2, 0):  # stopped after its checkpoint at update 2; stopped before its first checkpoint
        folder = tmp_path / f"stopped-at-{update}"
        assert train(folder).returncode == 0
        _cut_back(folder, update)
        assert train(folder, "--resume-if-any").returncode == 0
        assert (folder / "metrics.jsonl").read_text() == (whole / "metrics.jsonl").read_text()
        weights = [(run / "final" / "model.safetensors").read_bytes() for run in (folder, whole)]
        assert weights[0] == weights[1]

    assert_one_error_line(
        train(whole, "--resume-if-any", lr="3e-4"),
        "holds a run with other settings or another pool (lr: 0.0001 -> 0.0003)",
    )
    assert_one_error_line(
        train(whole, "--resume-if-any", "--resume"),
        "--resume-if-any decides between --resume and --overwrite itself: give it alone",
    )


def _cut_back(run: Path, update: int) -> None:
    """A finished run as it would be had it stopped at ``update``: its checkpoints up to that update, the
    metrics of the updates before it, no final model and no result."""
    for path in [run / "result.json", run / "final", *(run / "checkpoints").glob("update-*")]:
        if path.name in ("result.json", "final") or int(path.name.removeprefix("update-")) > update:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("".join(f"{x}\n" for x in lines if json.loads(x)["update"] < update))
