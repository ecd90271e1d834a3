"""Tests for a killed reward worker: its items are scored again (not timed out), the pool never hangs on
the lock it died holding, and workers that keep dying on one item end in one clear error."""

import multiprocessing
import os
import signal
import threading
import time
from types import SimpleNamespace

import psutil
import pytest

from ggpo_offline.core.errors import UserError
from ggpo_offline.generate.rewards import RewardResult, RewardScorer, _deaths_message
from ggpo_offline.generate.worker_pool import WatchedPool, discard, worker_processes

# Exact big-integer powers: a few seconds of CPU in a worker, then reward 1, so a kill lands mid-item and
# a lost item that went down the stall path instead (0, "timeout") cannot pass for it.
SLOW_OK = ("\\boxed{7^{2000000}}", "49^{1000000}")
QUICK = [("\\boxed{13}", "13"), ("no box 13", "13"), ("\\boxed{x^2+1}", "1+x^2"), ("\\boxed{8", "8")]
# So long that only the death handling, never the stall recovery, can finish a test.
NEVER_S = 600.0


def process_state(pid: int) -> str:
    """The kernel's one-letter state of a process: "R" running, "S" sleeping (an idle worker waits in
    a read), "Z" dead but not yet reaped."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def is_reaped(pid: int) -> bool:
    """Gone from the process table. Not merely a zombie: the first thread of a killed process shows "Z"
    while its other threads still hold its files open."""
    return not os.path.exists(f"/proc/{pid}")


def spawned_children() -> set[int]:
    """The live processes this one started with multiprocessing's spawn (its resource tracker is not one)."""
    pids = set()
    for child in psutil.Process().children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(child.cmdline()):
                pids.add(child.pid)
        except psutil.NoSuchProcess:
            continue  # it ended while being looked at
    return pids


@pytest.fixture
def worker_pids():
    """Lists, when called, the live spawned processes the test started: its scorer's workers (never,
    say, a vLLM engine another test left running)."""
    before = spawned_children()
    return lambda: sorted(spawned_children() - before)


def wait_for_state(pids: list[int], state: str, polls: int = 3000) -> None:
    # Bounded (30 s of polls) so a worker that never gets there still lets the test go on: it asserts
    # on results, which must be the same wherever the kill lands.
    for _ in range(polls):
        if all(process_state(pid) == state for pid in pids):
            return
        time.sleep(0.01)


def in_process(pairs: list[tuple[str, str]]) -> list[RewardResult]:
    return RewardScorer(workers=0, timeout_s=NEVER_S).submit(pairs).get()


def started_scorer(workers: int, worker_pids) -> RewardScorer:
    """A scorer whose workers have all started and wait for tasks."""
    scorer = RewardScorer(workers=workers, timeout_s=NEVER_S, hard_limit_s=NEVER_S)
    assert scorer.submit([("\\boxed{1}", "1")]).get() == [RewardResult(1.0, "1", "ok")]
    wait_for_state(worker_pids(), "S")
    return scorer


def test_an_item_whose_worker_is_killed_is_scored_again(worker_pids):
    pairs = [SLOW_OK, SLOW_OK, *QUICK]
    expected = in_process(pairs)
    assert expected[:2] == [RewardResult(1.0, "7^{2000000}", "ok")] * 2
    with started_scorer(2, worker_pids) as scorer:
        handle = scorer.submit(pairs)
        victim = worker_pids()[0]
        wait_for_state([victim], "R")  # it took a task: each worker is on a slow item for seconds
        os.kill(victim, signal.SIGKILL)
        assert handle.get() == expected
        assert victim not in worker_pids()
        assert scorer.submit(QUICK).get() == expected[2:]  # the new pool scores later batches
    assert (scorer.worker_deaths, scorer.restarts, scorer.timeouts, scorer.errors) == (1, 0, 0, 0)


def test_workers_killed_while_waiting_for_a_task_do_not_stop_the_pool(worker_pids):
    # An idle worker waits for a task holding the task queue's lock: killed, it would leave every other
    # worker (and Pool.terminate) waiting for that lock forever.
    with started_scorer(2, worker_pids) as scorer:
        victims = worker_pids()
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        while not all(is_reaped(pid) for pid in victims):  # both dead (the pool reaps them) before the batch
            time.sleep(0.01)
        assert scorer.submit(QUICK).get() == in_process(QUICK)
    assert (scorer.worker_deaths, scorer.restarts, scorer.timeouts) == (2, 0, 0)


def test_closing_after_a_worker_was_killed_stops_every_worker(worker_pids):
    scorer = started_scorer(2, worker_pids)
    pids = worker_pids()
    os.kill(pids[0], signal.SIGKILL)
    scorer.close()
    assert worker_pids() == []  # also the one the pool may have started in place of the killed one
    for pid in pids:  # reaped: no process (not even a zombie) is left with the id
        with pytest.raises(FileNotFoundError):
            process_state(pid)


def kill_each_new_worker(scorer: RewardScorer, worker_pids, times: int, killed: list[int]) -> None:
    while len(killed) < times:
        # Only once the scorer has replaced the pool of the last one killed: a multiprocessing Pool starts
        # a worker in place of a dead one itself, in the pool the scorer is about to discard. The deaths are
        # read before the processes: a list taken first could still hold that doomed replacement.
        replaced = scorer.worker_deaths == len(killed)
        new = [pid for pid in worker_pids() if pid not in killed]
        if replaced and new:
            os.kill(new[0], signal.SIGKILL)
            killed.append(new[0])
        time.sleep(0.01)


def test_workers_that_keep_dying_on_an_item_end_in_one_clear_error(worker_pids):
    killed: list[int] = []
    with RewardScorer(workers=1, timeout_s=NEVER_S, hard_limit_s=NEVER_S) as scorer:
        handle = scorer.submit([SLOW_OK, ("\\boxed{2}", "2")])
        killer = threading.Thread(target=kill_each_new_worker, args=(scorer, worker_pids, 3, killed))
        killer.start()
        with pytest.raises(UserError) as raised:
            handle.get()
        killer.join()
    assert str(raised.value) == (
        f"reward worker pid {killed[2]} was killed by signal 9 (SIGKILL) while scoring the boxed answer "
        "'7^{2000000}' against gold '49^{1000000}'; 3 reward workers have died while scoring this "
        "response, so it is not retried: find what kills them (the kernel's out-of-memory killer shows "
        "in dmesg) or give them more memory"
    )
    assert (scorer.worker_deaths, scorer.restarts, scorer.timeouts) == (3, 0, 0)


def test_a_worker_that_crashed_rather_than_was_killed_points_at_its_error_output():
    crashed = SimpleNamespace(pid=41, exitcode=1)
    assert _deaths_message(crashed, "no box here", "12") == (
        "reward worker pid 41 exited with code 1 while scoring a response without a boxed answer against "
        "gold '12'; 3 reward workers have died while scoring this response, so it is not retried: their "
        "error output above says why"
    )


def test_the_pool_keeps_every_worker_it_started_also_those_it_already_replaced():
    # Workers that exit as they start: multiprocessing's Pool drops each from its own list and starts
    # another within 0.1 s, often before anyone reading that list could see it (a death the scorer missed
    # left the task queue's lock held and the item scored "timeout" after a stall). Bounded, not timed:
    # the deadline only stops a broken pool from hanging the suite.
    pool = WatchedPool(1, os._exit, (3,), context=multiprocessing.get_context("spawn"))
    deadline = time.monotonic() + 120
    try:
        while len(ended := [p for p in worker_processes(pool) if p.exitcode is not None]) < 3:
            assert time.monotonic() < deadline, f"saw {len(worker_processes(pool))} workers in 120 s"
            time.sleep(0.01)
    finally:
        discard(pool)
    assert [process.exitcode for process in ended[:3]] == [3, 3, 3]
    assert len({process.pid for process in ended}) == len(ended)
