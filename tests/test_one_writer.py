"""A run folder has one writer: a second process that would write it (the same --resume in another
terminal, a Slurm task requeued while its predecessor still runs) is refused with one line naming the holder,
and the folder keeps each update once."""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import stopped_itself

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.one_writer import WRITER_LOCK, one_writer
from ggpo_offline.train.distributed import STOP_VARIABLE
from ggpo_offline.train.run_folder import RunFolder

GGPO = str(Path(sys.executable).parent / "ggpo")
HOLDER = rf"pid {os.getpid()} on {socket.gethostname()}"


def _refusal(path: Path, holder: str) -> str:
    return (
        f"{path} is being written by {holder}; a run folder has one writer: let it finish (or stop it), then "
        "--resume"
    )


def test_a_second_writer_in_the_same_process_is_refused_naming_the_holder(tmp_path):
    run = tmp_path / "run"
    with one_writer(run):
        (run / "metrics.jsonl").write_text("{}\n")
        assert (run / WRITER_LOCK).read_text() == HOLDER + "\n"
        with pytest.raises(UserError) as refused, one_writer(run):
            pass
        assert str(refused.value) == _refusal(run, HOLDER)
        assert (run / "metrics.jsonl").read_text() == "{}\n"  # the refused writer changed nothing
    with one_writer(run):  # let go when the block ends
        pass


def test_a_folder_made_only_to_hold_the_lock_is_removed_when_nothing_was_written(tmp_path):
    run = tmp_path / "never"
    with pytest.raises(UserError, match="--resume: nothing here"), one_writer(run):
        raise UserError("--resume: nothing here")
    assert not run.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    with one_writer(kept):
        pass
    assert kept.is_dir()  # it was the user's: left as it was found, lock file aside


def test_a_folder_that_cannot_be_made_is_one_line_naming_it(tmp_path):
    (tmp_path / "pools").write_text("a file where a folder is wanted")  # fails as root too, unlike chmod
    held = tmp_path / "pools" / ".x.parquet.partial"
    with pytest.raises(UserError) as refused, one_writer(held, temporary=True):
        pass
    assert str(refused.value) == f"cannot write {held / WRITER_LOCK}: Not a directory"


def test_the_lock_file_is_not_part_of_the_run(tmp_path):
    run = tmp_path / "run"
    with one_writer(run):
        folder = RunFolder(run)
        assert folder.is_empty()
        (run / "checkpoints").mkdir()
        (run / "config.json").write_text("{}")
        assert not folder.is_empty()
        folder.clear()  # --overwrite
        assert [p.name for p in run.iterdir()] == [WRITER_LOCK]
        with pytest.raises(UserError, match="is being written by"), one_writer(run):
            pass  # still held through the clearing


def test_a_second_resume_on_a_live_run_is_refused_and_each_update_is_written_once(vllm_pool, tmp_path):
    """The first `ggpo train` stops itself at update 4, after its checkpoint at update 2; the same command
    with --resume is refused while it lives, and the first, continued, writes updates 0-5 once each."""
    run = tmp_path / "run"
    command = [GGPO, "train", "--pool", str(vllm_pool), "--method", "grpo", "--updates", "6"]
    command += ["--groups-per-batch", "2", "--save-every", "2", "--no-tracking", "--threads", "1"]
    command += ["--out", str(run)]
    log = tmp_path / "first.log"  # a file, not a pipe: a full pipe would block the run before its stop
    with open(log, "w") as stderr:
        stop = {**os.environ, STOP_VARIABLE: "0:training update 4"}
        first = subprocess.Popen(command, env=stop, stderr=stderr)
    try:
        stopped_itself(first, log)
        second = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=600)
    finally:
        first.send_signal(signal.SIGCONT)
    holder = f"pid {first.pid} on {socket.gethostname()}"
    assert second.returncode == 1 and second.stderr.splitlines() == [f"error: {_refusal(run, holder)}"]
    assert first.wait(timeout=900) == 0, log.read_text()
    updates = [json.loads(line)["update"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert updates == list(range(6))
