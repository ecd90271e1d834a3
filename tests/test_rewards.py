"""Tests for the math-verify reward: boxed-answer extraction, scoring, timeouts and parallel scoring."""

import json
import random
import re
import sys
import threading
import time
from pathlib import Path

import pytest

from ggpo_offline.generate import rewards
from ggpo_offline.generate.rewards import (
    EXTRACTION_RULE,
    EXTRACTION_RULE_DESCRIPTION,
    RewardResult,
    RewardScorer,
    last_boxed_content,
    score_response,
)

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
# A real input whose comparison runs for minutes in sympy (9^(9^9) is evaluated exactly), so it
# exercises the time limits without any test-only hook.
SLOW_RESPONSE = "\\boxed{9^{9^{9}}}"


def verify_answer(response: str, gold: str) -> float:
    """1.0 when the response's last boxed answer equals ``gold`` by math-verify, else 0.0."""
    return score_response(response, gold).reward


def in_process(pairs: list[tuple[str, str]]) -> list[RewardResult]:
    return RewardScorer(workers=0).submit(pairs).get()


def read_jsonl(name: str) -> list[dict]:
    path = DATA_DIR / name
    if not path.exists():
        pytest.skip(f"real benchmark file {path} is absent (expected in ../shared/data next to the repo)")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def two_worker_scorer():
    with RewardScorer(workers=2) as scorer:
        yield scorer


def test_rule_constants_are_recordable():
    assert EXTRACTION_RULE == "last_boxed"
    assert "\\boxed{" in EXTRACTION_RULE_DESCRIPTION


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("no box here, the answer is 13", None),
        ("\\boxed{12} then \\boxed{13}", "13"),
        ("\\boxed{13} then \\boxed{12}", "12"),
        ("so \\boxed{8", None),  # truncated: never closes
        ("\\boxed{7} but then \\boxed{8", "7"),  # truncated last box: the earlier complete one counts
        ("\\boxed{\\frac{1}{\\sqrt{2}}}.", "\\frac{1}{\\sqrt{2}}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces are not structure
        ("\\boxed {5}", "5"),  # LaTeX allows space before the argument
        ("\\boxed 5", None),  # no braces: not an answer under this rule
        ("\\boxed{}", ""),
        ("\\boxed{ 42 }", "42"),
        ("\\boxed{\\boxed{5}}", "5"),
        ("} stray closer \\boxed{3}", "3"),
        ("$\\boxed{\\text{(C)}}$", "\\text{(C)}"),
    ],
)
def test_last_boxed_content(text, expected):
    assert last_boxed_content(text) == expected


def test_no_box_scores_zero():
    assert score_response("The answer is 13.", "13") == RewardResult(0.0, None, "no_box")


def test_unboxed_trailing_number_scores_zero():
    # math-verify alone would extract the trailing 13; the rule only reads boxed content.
    assert verify_answer("Adding up gives 13", "13") == 0.0
    assert score_response("I guess \\boxed{12}. Actually it is 13", "13").reward == 0.0


@pytest.mark.parametrize(
    ("response", "reward"), [("\\boxed{12} ... \\boxed{13}", 1.0), ("\\boxed{13} ... \\boxed{12}", 0.0)]
)
def test_last_box_wins(response, reward):
    assert verify_answer(response, "13") == reward


def test_truncated_box():
    assert score_response("so the answer is \\boxed{8", "8") == RewardResult(0.0, None, "no_box")
    assert score_response("\\boxed{8} wait, \\boxed{9", "8") == RewardResult(1.0, "8", "ok")


def test_fraction_equals_decimal_and_slash_forms():
    # math-verify compares values: 1/2, 0.5 and \frac{1}{2} are the same number, so all score 1.
    assert score_response("\\boxed{\\frac{1}{2}}", "0.5") == RewardResult(1.0, "\\frac{1}{2}", "ok")
    assert score_response("\\boxed{\\frac{1}{2}}", "1/2") == RewardResult(1.0, "\\frac{1}{2}", "ok")
    assert verify_answer("\\boxed{0.5}", "\\frac{1}{2}") == 1.0


def test_plain_and_wrong_answers():
    assert score_response("\\boxed{13}", "13") == RewardResult(1.0, "13", "ok")
    assert score_response("\\boxed{14}", "13") == RewardResult(0.0, "14", "ok")
    assert verify_answer("\\boxed{-3}", "3") == 0.0


def test_nested_braces_and_equivalent_forms():
    result = score_response("Thus $\\boxed{\\frac{1}{\\sqrt{2}}}$.", "\\frac{\\sqrt{2}}{2}")
    assert result == RewardResult(1.0, "\\frac{1}{\\sqrt{2}}", "ok")
    assert verify_answer("\\boxed{2\\sqrt{3}}", "\\sqrt{12}") == 1.0
    assert verify_answer("\\boxed{1,000}", "1000") == 1.0
    assert verify_answer("\\boxed{\\text{(C)}}", "\\text{(C)}") == 1.0
    assert verify_answer("\\boxed{C}", "\\text{(C)}") == 1.0


def test_empty_box_scores_zero():
    assert score_response("\\boxed{}", "5") == RewardResult(0.0, "", "ok")


def test_unparseable_gold_is_an_error():
    assert score_response("\\boxed{5}", "") == RewardResult(0.0, "5", "error")


def test_exception_is_scored_as_error(monkeypatch):
    def broken_verify(*args, **kwargs):
        raise RuntimeError("boom")

    parse, _ = rewards._math_verify()
    monkeypatch.setattr(rewards, "_math_verify", lambda: (parse, broken_verify))
    assert score_response("\\boxed{5}", "5") == RewardResult(0.0, "5", "error")


def test_timeout_scores_zero_in_process():
    score_response("\\boxed{1}", "1")  # builds math-verify's lazy state outside the tiny limit
    assert score_response(SLOW_RESPONSE, "1", timeout_s=0.3) == RewardResult(0.0, "9^{9^{9}}", "timeout")
    with RewardScorer(workers=0, timeout_s=0.3) as scorer:
        results = scorer.submit([(SLOW_RESPONSE, "1"), ("\\boxed{1}", "1")]).get()
    assert [result.status for result in results] == ["timeout", "ok"]
    assert (scorer.timeouts, scorer.errors) == (1, 0)


def test_scoring_off_the_main_thread_has_no_signal_error():
    # SIGALRM can't be used here, so scoring runs without a limit instead of failing.
    results = []
    thread = threading.Thread(target=lambda: results.append(score_response("\\boxed{13}", "13")))
    thread.start()
    thread.join()
    assert results == [RewardResult(1.0, "13", "ok")]


PAIRS = [
    ("\\boxed{13}", "13"),
    ("no box 13", "13"),
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{12} \\boxed{13}", "12"),
    ("\\boxed{x^2+1}", "1+x^2"),
    ("\\boxed{8", "8"),
    ("\\boxed{(1, 2)}", "(1,2)"),
    ("\\boxed{\\text{(C)}}", "\\text{(A)}"),
]


def test_parallel_scoring_equals_in_process(two_worker_scorer):
    expected = in_process(PAIRS)
    assert two_worker_scorer.submit(PAIRS).get() == expected
    assert [result.reward for result in expected] == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert two_worker_scorer.submit([]).get() == []


def test_scorer_keeps_its_pool_across_batches(two_worker_scorer):
    first = two_worker_scorer.submit(PAIRS[:4])
    second = two_worker_scorer.submit(PAIRS[4:])
    assert second.get() + first.get() == in_process(PAIRS[4:] + PAIRS[:4])
    assert first.get() is first.get()
    assert two_worker_scorer.restarts == 0


def test_drain_waits_for_a_batch_nobody_asked_for():
    with RewardScorer(workers=1, timeout_s=0.5) as scorer:
        scorer.submit([(SLOW_RESPONSE, "1")])  # dropped: the batch sampled past a pool's last kept group
        assert scorer.timeouts == 0
        scorer.drain()
        assert scorer.timeouts == 1  # its one item waited for, the workers idle for the next pool


def test_soft_timeout_in_worker_is_counted():
    with RewardScorer(workers=1, timeout_s=0.5) as scorer:
        results = scorer.submit([(SLOW_RESPONSE, "1"), ("\\boxed{2}", "2")]).get()
    assert results == [RewardResult(0.0, "9^{9^{9}}", "timeout"), RewardResult(1.0, "2", "ok")]
    assert (scorer.timeouts, scorer.restarts) == (1, 0)


def test_stalled_worker_is_replaced():
    # A soft limit far beyond the hard limit stands in for a computation the signal cannot interrupt.
    with RewardScorer(workers=1, timeout_s=60, hard_limit_s=2.0) as scorer:
        assert scorer.submit([("\\boxed{1}", "1")]).get()[0].reward == 1.0  # pool is up: no startup grace
        results = scorer.submit([("\\boxed{2}", "2"), (SLOW_RESPONSE, "1")]).get()
        assert results == [RewardResult(1.0, "2", "ok"), RewardResult(0.0, "9^{9^{9}}", "timeout")]
        assert (scorer.timeouts, scorer.restarts) == (1, 1)
        assert scorer.submit([("\\boxed{3}", "3")]).get() == [RewardResult(1.0, "3", "ok")]


def test_batch_queued_behind_a_slow_batch_is_not_stalled():
    # Progress is pool-wide: the second batch waits longer than hard_limit_s for its own result (40 items
    # of 0.2 s ahead of it), but the first batch keeps finishing items, so nothing is declared stalled. The
    # hard limit is 25 items' time: with 3 items' (0.5 s items, 1.5 s) a loaded machine (two busy compares
    # beside two test workers on two cores) left a gap of more than that between two items, and a worker
    # was replaced.
    with RewardScorer(workers=1, timeout_s=0.2, hard_limit_s=5.0) as scorer:
        scorer.submit([("\\boxed{1}", "1")]).get()
        slow = scorer.submit([(SLOW_RESPONSE, "1")] * 40)
        quick = scorer.submit([("\\boxed{2}", "2")])
        assert quick.get() == [RewardResult(1.0, "2", "ok")]
        assert [result.status for result in slow.get()] == ["timeout"] * 40
        assert (scorer.timeouts, scorer.restarts) == (40, 0)


def test_a_stall_costs_only_the_stuck_item_and_queued_batches_are_scored_by_the_new_pool():
    with RewardScorer(workers=1, timeout_s=60, hard_limit_s=2.0) as scorer:
        scorer.submit([("\\boxed{1}", "1")]).get()
        stalled = scorer.submit([(SLOW_RESPONSE, "1"), ("\\boxed{5}", "5")])
        queued = scorer.submit([("\\boxed{4}", "4")])
        assert stalled.get() == [RewardResult(0.0, "9^{9^{9}}", "timeout"), RewardResult(1.0, "5", "ok")]
        assert queued.get() == [RewardResult(1.0, "4", "ok")]
        assert (scorer.timeouts, scorer.restarts) == (1, 1)


def test_math500_gold_solutions_verify_against_gold_answers(two_worker_scorer):
    rows = read_jsonl("math500.jsonl")
    pairs = [(row["solution"], row["answer"]) for row in rows]
    results = two_worker_scorer.submit(pairs).get()
    misses = [
        (row["unique_id"], result.extracted_answer, row["answer"])
        for row, result in zip(rows, results, strict=True)
        if result.reward != 1.0
    ]
    passed = len(rows) - len(misses)
    print(f"MATH-500: {passed}/{len(rows)} gold solutions verify; misses: {misses}")
    assert len(rows) == 500
    assert passed >= 0.98 * len(rows), misses


def test_gsm8k_gold_answers_verify_against_themselves(two_worker_scorer):
    rows = read_jsonl("gsm8k_test.jsonl")
    golds = [re.fullmatch(r"#### (.+)", row["answer"].strip().splitlines()[-1]).group(1) for row in rows]
    golds = [gold.replace(",", "") for gold in golds]
    results = two_worker_scorer.submit([(f"\\boxed{{{gold}}}", gold) for gold in golds]).get()
    misses = [gold for gold, result in zip(golds, results, strict=True) if result.reward != 1.0]
    assert len(rows) == 1319
    assert misses == []


def _unicode_noise(length: int) -> str:
    rng = random.Random(0)
    ranges = [(0x20, 0x7F), (0x80, 0x2FFF), (0x1F300, 0x1FAFF)]  # ASCII, accents to CJK symbols, emoji
    return "".join(chr(rng.randrange(*rng.choice(ranges))) for _ in range(length))


# Hostile responses a policy could emit; scored against gold "1", so every one must score 0.
ADVERSARIAL = {
    "100k-char LaTeX": "\\boxed{" + "\\frac{1}{2}+" * 8_333 + "1}",
    "10,000 nested braces": "\\boxed{" + "{" * 10_000 + "2" + "}" * 10_000 + "}",
    "3,000 nested fractions": "\\boxed{" + "\\frac{1}{" * 3_000 + "2" + "}" * 3_000 + "}",
    "2,000 nested roots": "\\boxed{" + "\\sqrt{" * 2_000 + "2" + "}" * 2_000 + "}",
    "10,000 nested parentheses": "\\boxed{" + "(" * 10_000 + "2" + ")" * 10_000 + "}",
    "50,000 unclosed boxes": "\\boxed{" * 50_000,
    "unicode noise": "\\boxed{" + _unicode_noise(20_000) + "}",
    "10**100000 written out": "\\boxed{1" + "0" * 100_000 + "}",
    "power tower": "\\boxed{9^{9^{9^{9}}}}",
    "huge factorial": "\\boxed{(10^{10})!}",
    "huge binomial": "\\boxed{\\binom{10^{9}}{10^{8}}}",
    "3,000-term polynomial": "\\boxed{" + "+".join(f"x_{{{i}}}^{{{i}}}" for i in range(3_000)) + "}",
    "30x30 symbolic matrix": "\\boxed{\\begin{pmatrix}"
    + "\\\\".join("&".join(["x^{99}"] * 30) for _ in range(30))
    + "\\end{pmatrix}}",
}


@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{" * 100_000,  # every opener pending, none closes
        "{" * 200_000 + "\\boxed{1}" + "}" * 200_000,
        "\\boxed" + " " * 1_000_000,  # the opener's optional whitespace, never followed by {
        ("\\boxed" + " " * 100) * 10_000,
        "\\" * 1_000_000 + "\\boxed{1}",
        "\\boxed{1}" * 100_000,
    ],
    ids=["unclosed openers", "deep braces", "one long gap", "many gaps", "backslashes", "many boxes"],
)
def test_extraction_is_linear_on_hostile_input_of_up_to_a_million_characters(text):
    # It runs before (and, after a stall, outside) the per-item time limit, so it must stay linear:
    # a quadratic scan of 10^5-10^6 characters would take hours, a linear one well under a second. CPU
    # time, not wall time: on a loaded machine the wait for a core is not the scan's (1.1 s wall was seen
    # beside a make beyond).
    started = time.process_time()
    content = last_boxed_content(text)
    assert time.process_time() - started < 1.0
    assert content in (None, "1")


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_each_adversarial_response_is_scored_within_its_timeout(name):
    score_response("\\boxed{1}", "1")  # builds math-verify's lazy state outside the limit
    # The CPU the scoring spent: a limit that did not fire spends seconds; a loaded machine only stretches
    # the wall time (1.15 s wall was seen beside a make beyond, for a 0.5 s limit).
    started = time.process_time()
    result = score_response(ADVERSARIAL[name], "1", timeout_s=0.5)
    spent = time.process_time() - started
    assert result.reward == 0.0 and result.status in ("ok", "timeout", "error", "no_box")
    assert spent < 0.5 + 0.5, f"{name}: {spent:.2f} s of CPU"


def test_a_timeout_raised_inside_a_destructor_is_not_reported_as_unraisable(monkeypatch):
    # The time limit's repeat may fire inside a __del__ (sympy objects die mid-parse): that raise cannot
    # propagate, and the unraisable hook handling it (pytest's imports modules) could be interrupted in turn.
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: reported.append(unraisable.exc_type))
    hook = sys.unraisablehook

    class RaisesWhenCollected:
        def __init__(self, error: type[BaseException]):
            self.error = error

        def __del__(self):
            raise self.error

    with rewards._time_limit(60.0):
        RaisesWhenCollected(rewards._ScoringTimeout)
        RaisesWhenCollected(KeyError)  # any other unraisable still reaches the hook
    RaisesWhenCollected(rewards._ScoringTimeout)  # outside a time limit nothing is dropped
    assert reported == [KeyError, rewards._ScoringTimeout]
    assert sys.unraisablehook is hook  # restored when the limit ends


def test_a_batch_of_adversarial_responses_does_not_stall_the_workers():
    timeout_s, workers = 0.5, 2
    pairs = [(text, "1") for text in ADVERSARIAL.values()] * 2
    with RewardScorer(workers=workers, timeout_s=timeout_s) as scorer:
        scorer.submit([("\\boxed{1}", "1")]).get()  # worker start-up is not part of the bound
        started = time.perf_counter()
        results = scorer.submit(pairs).get()
        elapsed = time.perf_counter() - started
    # Each item ends by its own soft timeout, so the workers share the batch: items x timeout / workers,
    # plus slack for parsing and messaging; no item needs the (minutes-long) stall recovery.
    assert elapsed < len(pairs) * timeout_s / workers + 5.0, elapsed
    assert [result.reward for result in results] == [0.0] * len(pairs)
    assert scorer.restarts == 0
