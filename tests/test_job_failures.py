"""How a job that fails says so: the one line the launcher composes from its workers' reports, where
--resume continues, and the evaluation process's bounded waits. (The end-to-end kills are in
tests/test_distributed.py; random ones in tests/chaos.py, `make chaos`.)"""

import json
import os
import signal
from pathlib import Path

import pytest

from ggpo_offline.core.errors import JobFailure, UserError, how_it_ended
from ggpo_offline.evaluate.config import EvalConfig
from ggpo_offline.evaluate.remote_evaluator import RemoteEvaluator
from ggpo_offline.train import distributed
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.distributed import Ranks
from ggpo_offline.train.launch import FAILURE, LOST_PEER, USER, _failure_line, _report_file
from ggpo_offline.train.run_folder import STATE_FILE, resume_hint


def _report(folder: Path, rank: int, kind: str, message: str) -> None:
    _report_file(str(folder), rank).write_text(json.dumps({"kind": kind, "message": message}))


def _doing(folder: Path, monkeypatch, rank: int, what: str) -> None:
    monkeypatch.setenv(distributed.FOLDER_VARIABLE, str(folder))
    monkeypatch.setenv("RANK", str(rank))
    distributed.doing(what)


@pytest.fixture
def run(tmp_path) -> TrainConfig:
    checkpoint = tmp_path / "run" / "checkpoints" / "update-000004"
    checkpoint.mkdir(parents=True)
    (checkpoint / STATE_FILE).write_bytes(b"")
    (tmp_path / "reports").mkdir()
    return TrainConfig(out=tmp_path / "run")


def test_a_silent_death_beats_a_peer_that_only_saw_it_and_names_what_it_was_doing(run, tmp_path, monkeypatch):
    reports = tmp_path / "reports"
    _doing(reports, monkeypatch, 1, "training update 5")
    _report(reports, 0, LOST_PEER, "process 0 stopped waiting for the others")
    line = _failure_line(run, str(reports), 2, {0: 1, 1: -9})
    assert line == (
        "training process 1 was killed by signal 9 (SIGKILL) while training update 5; the same command with "
        f"--resume continues from update 4 ({run.out}/checkpoints/update-000004)"
    )


def test_bad_input_beats_a_failure_and_gets_no_resume_hint(run, tmp_path):
    reports = tmp_path / "reports"
    _report(reports, 1, FAILURE, "the evaluation engine (process 7) was killed by signal 9 (SIGKILL)")
    _report(reports, 0, USER, "--resume: the settings differ")
    assert _failure_line(run, str(reports), 2, {0: 1, 1: 1}) == "--resume: the settings differ"
    _report(reports, 0, LOST_PEER, "process 0 stopped waiting for the others")
    assert _failure_line(run, str(reports), 2, {0: 1, 1: 1}).startswith(
        "the evaluation engine (process 7) was killed by signal 9 (SIGKILL); the same command with --resume"
    )


def test_a_peer_that_stopped_answering_is_named_by_its_last_activity(run, tmp_path, monkeypatch):
    reports = tmp_path / "reports"
    _doing(reports, monkeypatch, 1, "waiting for the evaluation of update 2")
    _doing(reports, monkeypatch, 0, "evaluating update 2")
    _report(reports, 1, LOST_PEER, "process 1 stopped waiting for the others")
    line = _failure_line(run, str(reports), 2, {1: 1})
    assert line.startswith(
        "process 1 stopped waiting for the others; process 0 was last evaluating update 2;"
    )


def test_a_stop_point_is_read_once_and_only_its_rank_and_activity_stop(monkeypatch):
    """GGPO_STOP_AT is read where a run starts: unset, `doing` calls nothing; set, the process stops (SIGSTOP)
    on reaching each of its rank's activities, and on no other."""
    stops = []
    monkeypatch.setattr(distributed.os, "kill", lambda pid, sig: stops.append((pid, sig)))
    monkeypatch.delenv(distributed.FOLDER_VARIABLE, raising=False)
    monkeypatch.delenv(distributed.STOP_VARIABLE, raising=False)
    distributed.stop_when_asked(Ranks(rank=1, world=2))
    assert distributed._on_doing == {}
    points = "0:training update 0,1:training update 1,1:training update 3"
    monkeypatch.setenv(distributed.STOP_VARIABLE, points)
    distributed.stop_when_asked(Ranks(rank=1, world=2))
    monkeypatch.delenv(distributed.STOP_VARIABLE)  # read once: later changes do not matter
    for what in ("training update 0", "training update 1", "saving the checkpoint of update 3"):
        distributed.doing(what)
    assert stops == [(os.getpid(), signal.SIGSTOP)]  # at update 1: update 0 is rank 0's point
    distributed.doing("training update 3")
    assert stops == [(os.getpid(), signal.SIGSTOP)] * 2
    distributed.stop_when_asked(Ranks(rank=0, world=2))  # the next run, unset: nothing is called any more
    distributed.doing("training update 3")
    assert distributed._on_doing == {} and len(stops) == 2


def test_resume_hint_names_the_last_resumable_checkpoint_or_says_there_is_none(run, tmp_path):
    assert resume_hint(run.out).endswith(f"continues from update 4 ({run.out}/checkpoints/update-000004)")
    (run.out / "checkpoints" / "update-000006").mkdir()  # no run state: a save that did not finish
    assert "update 4" in resume_hint(run.out)
    assert resume_hint(tmp_path / "fresh") == (
        f"no checkpoint was saved yet: start it again with --overwrite (the run folder {tmp_path / 'fresh'})"
    )


@pytest.mark.parametrize(
    ("exitcode", "words"),
    [
        (-9, "was killed by signal 9 (SIGKILL)"),
        (-6, "was killed by signal 6 (SIGABRT)"),
        (-15, "was killed by signal 15 (SIGTERM)"),
        (-40, "was killed by signal 40"),  # a real-time signal has no name
        (1, "exited with code 1"),
    ],
)
def test_how_a_process_ended(exitcode, words):
    assert how_it_ended(exitcode) == words


def test_the_evaluation_process_reports_bad_input_as_the_users_error_line():
    with pytest.raises(UserError) as raised:
        RemoteEvaluator(EvalConfig(datasets=("arith:nosuchsplit",), engine="hf"), timeout_s=600)
    assert not isinstance(raised.value, JobFailure)
    assert "nosuchsplit" in str(raised.value)


def test_an_overdue_evaluation_process_is_stopped_with_one_line():
    """Starting a process and loading the benchmarks takes seconds: a 0.2 s bound is always overdue."""
    with pytest.raises(JobFailure) as raised:
        RemoteEvaluator(EvalConfig(engine="hf"), timeout_s=0.2)
    assert str(raised.value).endswith(
        "took more than 0.2 s checking the evaluation benchmarks and was stopped (--wait-timeout)"
    )


CHILD = """
import subprocess, sys, time
from ggpo_offline.core.lifetime import exit_with_parent
exit_with_parent()
sleeper = subprocess.Popen(["sleep", "600"])
print(sleeper.pid, flush=True)
time.sleep(600)
"""


def test_a_process_ends_with_its_parent_and_takes_its_children_along(tmp_path):
    """kill -9 of the parent: the child (a worker, the evaluation process, a reward worker) and what it
    started are gone soon after, not left to write into a run folder --resume continues."""
    import os
    import signal
    import subprocess
    import sys
    import time

    parent = subprocess.Popen(
        ["bash", "-c", f"{sys.executable} -c '{CHILD}' > {tmp_path / 'pid'} & wait"], start_new_session=True
    )
    while not (tmp_path / "pid").read_text().strip() if (tmp_path / "pid").exists() else True:
        time.sleep(0.1)
    sleeper = int((tmp_path / "pid").read_text())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    for _ in range(600):  # at most 60 s; the child looks every second
        try:
            os.kill(sleeper, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail("the child's own child outlived its parent by a minute")


SERVE_A_GONE_PARENT = """
from ggpo_offline.evaluate.config import EvalConfig
from ggpo_offline.evaluate.remote_evaluator import _serve

class Gone:  # the training process's end of the pipe, after it was killed mid-evaluation
    def __init__(self):
        self.requests = [("check", None, None), ("check", None, None)]
    def recv(self):
        return self.requests.pop(0)
    def send(self, answer):
        raise BrokenPipeError(32, "Broken pipe")

class Reset(Gone):  # killed while this process waited for its next request
    def recv(self):
        raise ConnectionResetError(104, "Connection reset by peer")

for conn in (Gone(), Reset()):
    _serve(conn, EvalConfig(engine="hf"))
    print("returned", len(conn.requests))
"""


def test_an_evaluation_process_whose_training_process_died_ends_without_a_traceback():
    """make chaos, seed 0, run 8: a killed rank 0 left its evaluation process answering into a broken pipe,
    and the job's output ended in two tracebacks instead of its one error line; seed 2, run 4: one waiting
    for its next request got a connection reset."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", SERVE_A_GONE_PARENT], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.split() == ["returned", "1", "returned", "2"], done.stderr
    assert "Traceback" not in done.stderr
