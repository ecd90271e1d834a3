"""The verifiable reward: the last boxed answer of a response, checked against the gold by an answer rule.

Long because the rule comes with the worker pool that applies it to every response of a pool or an
evaluation, and that pool's time limits, stall recovery and replacement of killed workers.

That supervisor (``RewardScorer``) is our own, over multiprocessing's Pool, because no library pool keeps
what the reward tests and ``make chaos`` check (measured on Python 3.11 with these workers):

- pebble 5.2's ProcessPool fails only a killed busy worker's item (ProcessExpired, with pid and exit
  code) and has per-item timeouts, but a worker killed while the pool is idle, where reward workers
  spend most of generate-pool, breaks the whole pool ("All workers expired": every later schedule
  raises); and one killed inside its task or result hand-over leaves pebble's channel lock held, so
  the healthy worker fails on it after 60 s, its item is charged a death (exit code 1), and the pool
  breaks after about 130 s: the supervisor below would still be needed on top.
- concurrent.futures.ProcessPoolExecutor and loky 3.7 fail every pending item of the pool on one death
  and are then unusable, without the dead worker's pid (loky: its exit code as text, the stdlib:
  neither), which the deaths error names; neither has a per-item time limit, and the stdlib one cannot
  stop a stuck worker before Python 3.14.
"""

from __future__ import annotations

import logging
import multiprocessing
import queue
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from functools import cache, lru_cache, partial
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Literal, get_args

from ggpo_offline.core.errors import UserError, how_it_ended, one_line
from ggpo_offline.core.lifetime import exit_with_parent
from ggpo_offline.generate.worker_pool import WatchedPool, discard, worker_processes

EXTRACTION_RULE = "last_boxed"
EXTRACTION_RULE_DESCRIPTION = (
    "the answer is the content of the last complete, brace-balanced \\boxed{...} in the response; "
    "a truncated \\boxed{ without its closing brace, \\boxed 5 without braces and unboxed text do not count; "
    "the answer rule then compares the content with the gold answer"
)

AnswerRule = Literal["math-verify", "number"]
"""How the boxed content is compared with the gold: see ``ANSWER_RULE_DESCRIPTIONS``."""
ANSWER_RULES: tuple[AnswerRule, ...] = get_args(AnswerRule)
ANSWER_RULE_DESCRIPTIONS: dict[str, str] = {
    "math-verify": (
        "math-verify parses the content and the gold and checks they are equivalent (parse + verify): "
        "equal values in any form count, so a box holding an expression that evaluates to the gold, "
        "such as the question's own \\boxed{3 + 4} for gold 7, scores 1"
    ),
    "number": (
        "the content must be a plain decimal number (optional sign, digits, optional decimal part, "
        "surrounding spaces allowed) numerically equal to the gold (7.0 and 07 equal 7); an expression, "
        "equation or text scores 0 (status not_a_number); no math-verify is involved"
    ),
}

# The pool is judged stalled when no item finishes for this long (the larger of the two): the soft
# (signal) timeout can miss a computation stuck in C code, and a worker that dies loses its task. Generous,
# because on a busy machine (vLLM sharing 2 cores) healthy workers can be slow.
HARD_LIMIT_FACTOR = 4.0
MIN_HARD_LIMIT_S = 60.0
# Spawned workers import sympy and math-verify before their first answer, which can take a while on a
# busy machine, so a fresh pool gets this much extra time before it is judged stalled.
POOL_STARTUP_GRACE_S = 120.0
# How often a waiting ``get`` looks for dead workers. A killed worker's task is lost, and one killed while
# waiting for a task dies holding the task queue's lock, which stops the whole pool: only a new pool
# scores again, and the sooner the better.
DEATH_CHECK_S = 0.5
# An item that was being scored at this many worker deaths is not retried: it may be what kills them
# (memory), and an endless retry would hide that.
MAX_WORKER_DEATHS = 3

# ASCII digits only: Python's \d (and Decimal) would also take digits of other scripts.
_PLAIN_NUMBER = re.compile(r"\s*([+-]?[0-9]+(?:\.[0-9]+)?)\s*", re.ASCII)
# \boxed{ opens a box; \{ \} \\ are escapes that must not count as braces; { and } are plain braces.
_BOX_TOKENS = re.compile(r"\\boxed\s*\{|\\[{}\\]|[{}]")


@dataclass(frozen=True)
class RewardResult:
    """The score of one response, with what was extracted and how scoring ended."""

    reward: float
    extracted_answer: str | None
    """Content of the last complete \\boxed{...}, or None when the response has none."""
    status: str
    """One of "ok", "no_box", "not_a_number" (number rule: the box holds no plain number), "timeout",
    "error"."""


TIMEOUT_REPEAT_S = 0.05


class _ScoringTimeout(BaseException):
    """Raised by our SIGALRM handler: a BaseException, so math-verify's ``except Exception`` lets it pass."""


class _DropDisabledTimeoutWarning(logging.Filter):
    """We pass math-verify no timeouts because we run our own timer, so its warning about that is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _logger_name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_logger_name).addFilter(_DropDisabledTimeoutWarning())


def last_boxed_content(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (the one opened last among those that close), or None."""
    open_braces: list[int | None] = []  # content start for a \boxed{ opener, None for a plain {
    last_start, last_end = -1, -1
    for token in _BOX_TOKENS.finditer(text):
        piece = token.group()
        if piece == "}":
            if open_braces:
                start = open_braces.pop()
                if start is not None and start > last_start:
                    last_start, last_end = start, token.start()
        elif piece == "{":
            open_braces.append(None)
        elif piece.startswith("\\boxed"):
            open_braces.append(token.end())
    if last_start < 0:
        return None
    return text[last_start:last_end].strip()


@cache
def _math_verify() -> tuple[Callable[[str], list], Callable[[list, list], bool]]:
    """math-verify's parse (boxed-answer extraction, no time limit of its own) and verify, imported on first
    use: they bring in sympy, about a second that every `ggpo` command would otherwise pay at start."""
    from math_verify import LatexExtractionConfig, parse, verify

    parse_boxed = partial(parse, extraction_config=(LatexExtractionConfig(),), parsing_timeout=None)
    return parse_boxed, partial(verify, timeout_seconds=None)


@lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> tuple:
    # Cached because the m responses to one prompt share its gold; a tuple so callers can't mutate it.
    return tuple(_parse_boxed(gold))


def _parse_boxed(content: str) -> list:
    # Re-boxing the content sends it through math-verify's boxed-answer normalization (units, \text, ...).
    parse, _ = _math_verify()
    return parse(f"\\boxed{{{content}}}")


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise _ScoringTimeout after ``seconds``; signals only reach the main thread, elsewhere no limit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous_handler = signal.signal(signal.SIGALRM, _raise_timeout)
    # A library may have blocked SIGALRM in this thread, or a bare ``except:`` may swallow one raise:
    # unblock it, and keep firing every TIMEOUT_REPEAT_S until the block is left.
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGALRM])
    # A raise inside a destructor cannot propagate and goes to sys.unraisablehook, which the next repeat
    # could interrupt in turn (pytest's hook imports modules there): drop those, the repeat is what counts.
    previous_hook = sys.unraisablehook
    sys.unraisablehook = partial(_drop_scoring_timeouts, previous_hook)
    signal.setitimer(signal.ITIMER_REAL, seconds, TIMEOUT_REPEAT_S)
    try:
        yield
    finally:
        while True:  # a repeat may fire while the timer is being stopped: stop it again
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
                break
            except _ScoringTimeout:
                continue
        sys.unraisablehook = previous_hook
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        # None means the old handler was set outside Python; the default is the closest we can restore.
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous_handler is None else previous_handler)


def _raise_timeout(signum: int, frame: object) -> None:
    raise _ScoringTimeout


def _drop_scoring_timeouts(hook, unraisable) -> None:
    if unraisable.exc_type is not _ScoringTimeout:
        hook(unraisable)


def plain_number(text: str) -> Decimal | None:
    """The value of ``text`` when it is a plain decimal number (optional sign, ASCII digits, optional
    decimal part, surrounding whitespace), else None: ``" -7.50 "`` -> -7.50, ``"3 + 4"`` -> None."""
    match = _PLAIN_NUMBER.fullmatch(text)
    return Decimal(match.group(1)) if match else None


def _check_rule(rule: str) -> None:
    if rule not in ANSWER_RULES:
        raise ValueError(f"unknown answer rule {rule!r}; choose one of {', '.join(ANSWER_RULES)}")


def score_response(
    response: str, gold: str, timeout_s: float = 5.0, rule: AnswerRule = "math-verify"
) -> RewardResult:
    """Score one response: 1.0 when its last boxed answer equals ``gold`` under ``rule``, else 0.0.

    ``rule`` "math-verify": math-verify decides equivalence (an expression equal to the gold counts);
    "number": the box must hold a plain number equal to the gold, anything else scores 0 with status
    "not_a_number" (see ``ANSWER_RULE_DESCRIPTIONS``). Never raises for any response or gold (an unknown
    ``rule`` is a ValueError): a parse/verify that runs past ``timeout_s`` scores 0 with status "timeout",
    any exception scores 0 with status "error". The time limit uses SIGALRM, so it applies only when
    called from a process's main thread (``RewardScorer`` workers always are).
    """
    _check_rule(rule)
    extracted = last_boxed_content(response)
    if extracted is None:
        return RewardResult(0.0, None, "no_box")
    if rule == "number":
        return _score_number(extracted, gold)
    _, verify = _math_verify()  # imported outside the time limit: a first import may take longer
    try:
        with _time_limit(timeout_s):
            gold_parsed = list(_parse_gold(gold))
            if not gold_parsed:
                return RewardResult(0.0, extracted, "error")
            correct = verify(gold_parsed, _parse_boxed(extracted))
    except _ScoringTimeout:
        return RewardResult(0.0, extracted, "timeout")
    except Exception:
        return RewardResult(0.0, extracted, "error")
    return RewardResult(1.0 if correct else 0.0, extracted, "ok")


def _score_number(extracted: str, gold: str) -> RewardResult:
    # No time limit: a regex without nested repeats and one Decimal comparison are linear in the length.
    gold_value = plain_number(gold)
    if gold_value is None:
        return RewardResult(0.0, extracted, "error")  # the number rule needs a numeric gold
    value = plain_number(extracted)
    if value is None:
        return RewardResult(0.0, extracted, "not_a_number")
    return RewardResult(1.0 if value == gold_value else 0.0, extracted, "ok")


def _init_worker() -> None:
    # Ctrl-C goes to the whole process group; the parent handles it and terminates the pool.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A worker holds both ends of the task queue, so it would wait forever for tasks of a killed parent.
    exit_with_parent()
    # The first score imports math-verify and builds its lazy state; do it here, outside any item's limit.
    score_response("\\boxed{1}", "1", timeout_s=60.0)


def _deaths_message(worker: BaseProcess, response: str, gold: str) -> str:
    """Why scoring stops after ``MAX_WORKER_DEATHS`` deaths, the last one ``worker``'s, on one response."""
    answer = last_boxed_content(response)
    scored = "a response without a boxed answer" if answer is None else f"the boxed answer {answer!r}"
    if worker.exitcode is not None and worker.exitcode < 0:
        advice = (
            "find what kills them (the kernel's out-of-memory killer shows in dmesg) or give them more memory"
        )
    else:
        advice = "their error output above says why"
    return (
        f"reward worker pid {worker.pid} {how_it_ended(worker.exitcode)} while scoring "
        f"{one_line(scored, 100)} "
        f"against gold {one_line(repr(gold), 60)}; {MAX_WORKER_DEATHS} reward workers have died while "
        f"scoring this response, so it is not retried: {advice}"
    )


@dataclass(eq=False)
class _Batch:
    """One submitted batch as its scorer tracks it; only ``RewardScorer`` reads or writes these fields."""

    pairs: list[tuple[str, str]]
    rules: list[AnswerRule]
    submitted_at: float
    """When the batch's stall clock started: its submission, or the start of the pool that took it over."""
    results: list[RewardResult | None]
    deaths: list[int]
    """Worker deaths while each item was being scored."""

    def missing(self) -> list[int]:
        """The indices still without a result, in submission order."""
        return [index for index, result in enumerate(self.results) if result is None]

    def take(self, index: int, result: RewardResult) -> None:
        if self.results[index] is None:  # a late answer from a replaced pool may repeat an item
            self.results[index] = result


class ScoringHandle:
    """The pending scores of one submitted batch; ``get()`` waits for them."""

    def __init__(self, scorer: RewardScorer, batch: _Batch) -> None:
        self._scorer = scorer
        self._batch = batch
        self._results: list[RewardResult] | None = None

    def get(self) -> list[RewardResult]:
        """The results in submission order (see ``RewardScorer.wait``); the same list on every call."""
        if self._results is None:
            self._results = self._scorer.wait(self._batch)
        return self._results


class RewardScorer:
    """Scores batches of (response, gold) pairs in a pool of spawned worker processes kept across batches.

    Each item gets a soft ``timeout_s`` (SIGALRM in the worker's main thread). If the pool makes no
    progress for ``hard_limit_s`` (default: the larger of 60 s and 4 × timeout_s), the items the workers
    were stuck on score 0 with status "timeout", the pool is replaced, and every item still queued is
    scored by the new pool: a stall costs only the stuck items. A worker that dies (killed, out of
    memory) is seen within ``DEATH_CHECK_S`` while results are awaited: the pool is replaced and every
    unfinished item scored again, since scoring is deterministic; an item being scored at
    ``MAX_WORKER_DEATHS`` deaths ends in a UserError. ``workers=0`` scores in the calling process,
    time-limited only on its main thread. The answer rule is given per ``submit``, so one scorer serves
    benchmarks with different rules. Counters: ``timeouts``, ``errors``, ``restarts`` (stalls) and
    ``worker_deaths``.
    """

    def __init__(self, workers: int, timeout_s: float = 5.0, hard_limit_s: float | None = None) -> None:
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.workers = workers
        self.timeout_s = timeout_s
        if hard_limit_s is None:
            hard_limit_s = max(MIN_HARD_LIMIT_S, HARD_LIMIT_FACTOR * timeout_s)
        self.hard_limit_s = hard_limit_s
        self.timeouts = 0
        self.errors = 0
        self.restarts = 0
        self.worker_deaths = 0
        self._pending: list[_Batch] = []  # submission order = the pool's FIFO task order
        # Results as the pool's result thread hands them over, for whichever batch they belong to.
        self._arrived: queue.Queue[tuple[_Batch, int, RewardResult]] = queue.Queue()
        self._last_result_at: float | None = None  # when any batch last got a result from this pool
        self._pool: WatchedPool | None = None
        if workers > 0:
            self._start_pool([])

    def submit(
        self, pairs: Sequence[tuple[str, str]], rule: AnswerRule | Sequence[AnswerRule] = "math-verify"
    ) -> ScoringHandle:
        """Start scoring ``pairs`` under answer ``rule`` (one for all pairs, or one per pair);
        ``handle.get()`` returns the results in the same order. An unknown rule is a ValueError."""
        pairs = list(pairs)
        rules = [rule] * len(pairs) if isinstance(rule, str) else list(rule)
        if len(rules) != len(pairs):
            raise ValueError(f"{len(rules)} answer rules for {len(pairs)} pairs")
        for name in set(rules):
            _check_rule(name)  # here, not in a worker, where it would only read as status "error"
        batch = _Batch(pairs, rules, time.monotonic(), [None] * len(pairs), [0] * len(pairs))
        if self._pool is None:
            for index, ((response, gold), name) in enumerate(zip(pairs, rules, strict=True)):
                batch.take(index, score_response(response, gold, self.timeout_s, name))
        else:
            self._replace_dead_workers()  # a worker that died idle would stop the pool before this batch
            for index in range(len(pairs)):
                self._apply(batch, index)
        self._pending.append(batch)
        return ScoringHandle(self, batch)

    def wait(self, batch: _Batch) -> list[RewardResult]:
        """``batch``'s results in submission order, once all are in (what ``ScoringHandle.get`` returns):
        an item a stalled worker was stuck on scores 0 ("timeout"), an item a dead worker held is scored
        again. A UserError when workers keep dying on one item."""
        while True:
            self._take_arrived()
            if not batch.missing():
                break
            self._replace_dead_workers()
            wait_s = self._stall_deadline(batch.submitted_at) - time.monotonic()
            if wait_s <= 0:
                self._recover_from_stall()
                continue
            try:
                arrived, index, result = self._arrived.get(timeout=min(wait_s, DEATH_CHECK_S))
            except queue.Empty:
                continue  # another batch may have made progress, which moves the deadline
            arrived.take(index, result)
        self._pending.remove(batch)
        self.timeouts += sum(result.status == "timeout" for result in batch.results)
        self.errors += sum(result.status == "error" for result in batch.results)
        return list(batch.results)

    def drain(self) -> None:
        """Wait for every submitted batch, wanted or not (`wait`), so that the workers are idle."""
        for batch in list(self._pending):
            self.wait(batch)

    def close(self) -> None:
        """Stop the worker processes."""
        if self._pool is not None:
            discard(self._pool)
            self._pool = None

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _apply(self, batch: _Batch, index: int) -> None:
        response, gold = batch.pairs[index]
        self._pool.apply_async(
            score_response,
            (response, gold, self.timeout_s, batch.rules[index]),
            callback=partial(self._arrive, batch, index),
            error_callback=partial(self._arrive_failed, batch, index),
        )

    def _arrive(self, batch: _Batch, index: int, result: RewardResult) -> None:
        # Runs in the pool's result thread.
        self._last_result_at = time.monotonic()
        self._arrived.put((batch, index, result))

    def _arrive_failed(self, batch: _Batch, index: int, error: BaseException) -> None:
        self._arrive(batch, index, RewardResult(0.0, None, "error"))

    def _take_arrived(self) -> None:
        """Put every result that has arrived in its batch."""
        while True:
            try:
                batch, index, result = self._arrived.get_nowait()
            except queue.Empty:
                return
            batch.take(index, result)

    def _start_pool(self, items: list[tuple[_Batch, int]]) -> None:
        """Start a pool and send it ``items``; every pending batch's stall clock starts again."""
        # spawn, not fork: forking a process that holds torch/vLLM threads can deadlock the child.
        self._pool = WatchedPool(self.workers, _init_worker, context=multiprocessing.get_context("spawn"))
        self._last_result_at = None
        for batch in self._pending:
            batch.submitted_at = time.monotonic()
        for batch, index in items:
            self._apply(batch, index)

    def _stop_pool(self) -> list[tuple[_Batch, int]]:
        """Stop the pool; the unfinished items of all pending batches, in the pool's FIFO task order, so
        the first ``workers`` of them are the ones the workers held."""
        discard(self._pool)
        self._take_arrived()
        return [(batch, index) for batch in self._pending for index in batch.missing()]

    def _stall_deadline(self, submitted_at: float) -> float:
        """When a batch submitted at ``submitted_at`` gives up, unless some result arrives before then."""
        if self._last_result_at is None:
            return submitted_at + self.hard_limit_s + POOL_STARTUP_GRACE_S
        # Progress is pool-wide: a batch queued behind another one waits while that one advances.
        return max(self._last_result_at, submitted_at) + self.hard_limit_s

    def _recover_from_stall(self) -> None:
        """Replace the pool: the items the workers were stuck on time out; all later ones are sent to the
        new pool."""
        unfinished = self._stop_pool()
        self.restarts += 1
        for batch, index in unfinished[: self.workers]:
            batch.take(index, RewardResult(0.0, last_boxed_content(batch.pairs[index][0]), "timeout"))
        self._start_pool(unfinished[self.workers :])

    def _replace_dead_workers(self) -> None:
        """When a worker has died, replace the pool and send every unfinished item to the new one; a
        UserError when an item the workers held has now been held at ``MAX_WORKER_DEATHS`` deaths."""
        # A dead worker's sentinel reads as ready at once; its exit code may read None while the pool's own
        # thread reaps it, and is read only once the pool is stopped (that thread joined).
        started = worker_processes(self._pool)
        ended = set(wait([worker.sentinel for worker in started], timeout=0))
        dead = [worker for worker in started if worker.sentinel in ended]
        if not dead:
            return
        unfinished = self._stop_pool()
        self.worker_deaths += len(dead)
        for batch, index in unfinished[: self.workers]:
            batch.deaths[index] += 1
            if batch.deaths[index] >= MAX_WORKER_DEATHS:
                raise UserError(_deaths_message(dead[0], *batch.pairs[index]))
        self._start_pool(unfinished)
