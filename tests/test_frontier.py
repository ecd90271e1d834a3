"""Accuracy at matched drift: the interpolation on a synthetic comparison whose answer is known by hand, its
counts round trip, and a simulation with runs that differ in which equal methods are resolved ~5 % of the
time."""

import numpy as np
import pytest

from ggpo_offline.compare import stats
from ggpo_offline.compare.blocks import markdown_text
from ggpo_offline.compare.counts import Counts
from ggpo_offline.compare.frontier import common_reach, frontier_section, matched_levels
from ggpo_offline.compare.scores import At, Matched, Scores, crossing

PROMPTS = ("p0", "p1", "p2", "p3")
CORRECT = {  # of n = 2, per problem
    ("grpo", 1): {0: (1, 1, 1, 1), 10: (2, 1, 1, 0), 20: (2, 2, 1, 1)},
    ("grpo", 2): {0: (1, 1, 1, 1), 10: (1, 1, 1, 1), 20: (2, 2, 2, 0)},
    ("ggpo", 1): {0: (1, 1, 1, 1), 10: (2, 2, 2, 2), 20: (0, 0, 0, 0)},
    ("ggpo", 2): {0: (1, 1, 1, 1), 10: (2, 2, 1, 1), 20: (0, 0, 1, 0)},
}
K3 = {  # probe K3 at updates 0, 10, 20: GGPO moves from π0 four times as fast
    ("grpo", 1): (0.0, 0.25, 0.5),
    ("grpo", 2): (0.0, 0.25, 0.75),
    ("ggpo", 1): (0.0, 1.0, 2.0),
    ("ggpo", 2): (0.0, 0.5, 1.5),
}


def _counts(correct=CORRECT, k3=K3, seeds=(1, 2)) -> Counts:
    return Counts(
        methods=("grpo", "ggpo"),
        seeds=seeds,
        n={"validation": 2},
        ks={"validation": (1,)},
        prompts={"validation": {"b": PROMPTS}},
        correct={
            (m, s, "validation", u): {"b": c}
            for (m, s), by_update in correct.items()
            for u, c in by_update.items()
        },
        selected={},
        drift={},
        probe={key: tuple((u, d, -d) for u, d in zip((0, 10, 20), k3[key], strict=True)) for key in k3},
    )


def test_crossing_is_the_first_segment_that_reaches_the_level():
    points = [(0, 0.0), (10, 0.4), (20, 0.2), (30, 0.8)]
    assert crossing(points, 0.0) == (0, 0, 0.0)
    assert crossing(points, 0.1) == (0, 10, 0.25)
    assert crossing(points, 0.4) == (0, 10, 1.0)
    assert crossing(points, 0.6) == (20, 30, (0.6 - 0.2) / (0.8 - 0.2))  # after drift fell back
    assert crossing(points, 0.9) is None


def test_scores_at_matched_drift_are_the_known_interpolation():
    scores = Scores(_counts())
    assert common_reach(scores, ["grpo", "ggpo"]) == 0.5  # GRPO seed 1's largest K3
    assert matched_levels(scores, ["grpo", "ggpo"]) == [0.125, 0.25, 0.5]
    at = At("validation", "b", Matched(0.5))
    # grpo s1 reaches 0.5 at update 20; s2 halfway from 10 to 20; ggpo s1 halfway from 0 to 10; s2 at 10
    assert scores.points("grpo", at).tolist() == [[100, 100, 50, 50], [75, 75, 75, 25]]
    assert scores.points("ggpo", at).tolist() == [[75, 75, 75, 75], [100, 100, 50, 50]]
    assert scores.cell("grpo", at).values == (75.0, 62.5) and scores.cell("ggpo", at).values == (75.0, 75.0)
    # the binomial variance mixes with squared weights: the two evaluations sampled independently
    half = 0.25 * stats.sampling_variance(np.array([[1, 1, 1, 1]]), 2) + 0.25 * stats.sampling_variance(
        np.array([[2, 2, 2, 0]]), 2
    )
    assert scores._sampling("grpo", at)[1].tolist() == half[0].tolist()
    # at matched updates the ranking is the other way round: GGPO has collapsed by update 20
    assert scores.cell("ggpo", At("validation", "b", 20)).values == (0.0, 12.5)
    with pytest.raises(ValueError, match="never reaches probe K3 0.8"):
        scores.points("grpo", At("validation", "b", Matched(0.8)))


def test_the_matched_drift_table_and_its_csv_rows():
    blocks, rows = frontier_section(Scores(_counts()), ["grpo", "ggpo"])
    text = markdown_text(blocks)
    lines = text.split("\n")
    assert "### Accuracy at matched drift" in text and "(0.5)" in text  # the common reach
    table = [line for line in lines if line.startswith("| 0.")]
    assert [line.split(" | ")[0] for line in table] == ["| 0.125", "| 0.25", "| 0.5"]
    assert "68.75 ± 8.84" in table[-1] and "**75.00 ± 0.00**" in table[-1]
    assert {row["checkpoint"] for row in rows} == {"probe_k3=0.125", "probe_k3=0.25", "probe_k3=0.5"}
    grpo = next(r for r in rows if r["checkpoint"] == "probe_k3=0.5" and r["method"] == "grpo")
    assert (grpo["mean"], grpo["versus"], grpo["table"]) == (68.75, "ggpo", "matched_drift")
    # the paper's claim (a) at matched drift: GGPO − GRPO at every level, one family; no (d) without GRPO+TIS
    claimed = [r for r in rows if r["table"] == "claim a, matched drift"]
    assert [(r["method"], r["versus"], r["checkpoint"], r["family"]) for r in claimed] == [
        ("ggpo", "grpo", f"probe_k3={level}", 3) for level in ("0.125", "0.25", "0.5")
    ]
    assert claimed[-1]["difference"] == 75 - 68.75 and "(a) at matched drift, GGPO is the highest" in text
    assert "(d) at matched drift" not in text
    no_probe = Counts(**{**_counts().__dict__, "probe": {}})
    assert frontier_section(Scores(no_probe), ["grpo", "ggpo"]) == ([], [])


def test_counts_keep_the_probe_and_old_counts_keep_their_bytes(tmp_path):
    counts = _counts()
    counts.write(tmp_path / "counts.json")
    assert Counts.read(tmp_path / "counts.json") == counts
    bare = Counts(**{**counts.__dict__, "probe": {}})
    bare.write(tmp_path / "bare.json")
    assert '"probe"' not in (tmp_path / "bare.json").read_text()
    assert Counts.read(tmp_path / "bare.json") == bare


def _simulated_counts(rng: np.random.Generator, seeds: int, problems: int, n: int) -> Counts:
    """Two equal methods: problems differ (shared), runs differ (a run better or worse on every problem and
    on each problem), drift differs run by run; two checkpoints each sampled binomially."""
    difficulty = rng.normal(0.0, 1.5, problems)
    correct, k3 = {}, {}
    for method in ("grpo", "ggpo"):
        for seed in range(seeds):
            run = rng.normal(0.0, 0.4) + rng.normal(0.0, 0.3, problems)
            by_update = {}
            for update, gain in ((0, 0.0), (10, 0.3), (20, 0.6)):
                p = 1 / (1 + np.exp(-(difficulty + run * (update > 0) + gain)))
                by_update[update] = tuple(int(c) for c in rng.binomial(n, p))
            correct[method, seed] = by_update
            k3[method, seed] = (0.0, rng.uniform(0.1, 0.3), rng.uniform(0.5, 0.9))
    prompts = tuple(f"p{i}" for i in range(problems))
    base = _counts(correct, k3, tuple(range(seeds)))
    return Counts(**{**base.__dict__, "n": {"validation": n}, "prompts": {"validation": {"b": prompts}}})


@pytest.mark.parametrize("seeds", [3, 5])
def test_equal_methods_at_matched_drift_are_resolved_about_five_percent_of_the_time(seeds):
    rng = np.random.default_rng(7)
    resolved = 0
    reps = 1000
    for _ in range(reps):
        counts = _simulated_counts(rng, seeds, problems=48, n=4)
        at = At("validation", "b", Matched(0.4))  # between every run's update 10 and 20
        resolved += Scores(counts).difference("ggpo", "grpo", at).p_value < 0.05
    # measured 2.4 % (3 seeds) and 4.1 % (5 seeds); a Monte-Carlo error of 0.7 points either way
    assert 0.01 <= resolved / reps <= 0.065
