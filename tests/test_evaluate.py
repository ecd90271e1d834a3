"""Evaluation: pass@k against brute force, the problem-weighted suite by hand, settings from a pool, and
end-to-end runs on the tiny model (library with the session vLLM engine, CLI with the hf engine)."""

import itertools
import json
import math
import pickle
import shutil
from dataclasses import replace
from fractions import Fraction

import pytest
from conftest import write_synthetic_pool
from test_cli import assert_one_error_line, ggpo, ggpo_here

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.model_io import weights_sha256
from ggpo_offline.evaluate.benchmark_scores import aggregate, pass_at_k, reported_ks
from ggpo_offline.evaluate.config import EvalConfig
from ggpo_offline.evaluate.eval_report import EvalReport
from ggpo_offline.evaluate.evaluator import evaluate, resolve_sampling


def brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """The fraction of size-k subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in subset) for subset in subsets), len(subsets))


def test_pass_at_k_equals_the_average_over_all_size_k_subsets():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = brute_force_pass_at_k(n, c, k)
                assert pass_at_k(n, c, k) == pytest.approx(float(expected), abs=1e-12), (n, c, k)


def test_pass_at_k_edge_cases():
    assert pass_at_k(8, 0, 1) == 0.0 and pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(8, 8, 1) == 1.0 and pass_at_k(8, 8, 8) == 1.0
    assert pass_at_k(8, 3, 6) == 1.0  # k > n - c: every k-subset holds a correct sample
    assert pass_at_k(8, 3, 5) == pytest.approx(1 - 1 / 56, abs=1e-15)  # 1 - C(5,5)/C(8,5)
    assert pass_at_k(32, 5, 1) == pytest.approx(5 / 32, abs=1e-15)  # pass@1 = mean@n = c/n
    # Large n: the product form stays exact where C(n, k) has hundreds of digits.
    exact = 1 - Fraction(math.comb(997, 500), math.comb(1000, 500))
    assert pass_at_k(1000, 3, 500) == pytest.approx(float(exact), abs=1e-12)
    for bad in [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_suite_is_problem_weighted_not_the_mean_of_benchmark_means():
    counts = {"A": {"a1": 4, "a2": 0}, "B": {f"b{i}": c for i, c in enumerate([0, 0, 0, 0, 1, 2])}}
    benchmarks, suite = aggregate(counts, n=4, ks=(1, 2, 8))
    a, b = benchmarks["A"], benchmarks["B"]
    assert (a.num_problems, b.num_problems, suite.num_problems) == (2, 6, 8)
    assert a.mean_at_n == pytest.approx(4 / 8, abs=1e-15)
    assert b.mean_at_n == pytest.approx(3 / 24, abs=1e-15)
    assert suite.mean_at_n == pytest.approx(7 / 32, abs=1e-15)  # (4 + 0 + 0 + 0 + 0 + 0 + 1 + 2) / (8 * 4)
    assert suite.mean_at_n != pytest.approx((a.mean_at_n + b.mean_at_n) / 2)  # 0.3125
    # pass@2 with n = 4: c=0 -> 0, c=1 -> 1 - 3/6, c=2 -> 1 - 1/6, c=4 -> 1.
    assert a.pass_at_k[2] == pytest.approx((1 + 0) / 2, abs=1e-15)
    assert b.pass_at_k[2] == pytest.approx((1 / 2 + 5 / 6) / 6, abs=1e-15)
    assert suite.pass_at_k[2] == pytest.approx((1 + 1 / 2 + 5 / 6) / 8, abs=1e-15)
    assert suite.pass_at_k[1] == suite.mean_at_n
    assert list(suite.pass_at_k) == [1, 2] and reported_ks((8, 1, 2, 1), 4) == [1, 2]  # no pass@8 of 4
    assert a.counts == counts["A"]


# An eval/update-*.json as the evaluator writes it (a real report's keys, order and float reprs, counts cut).
WRITTEN_REPORT = """{
  "n": 8,
  "ks": [
    1,
    4,
    8
  ],
  "benchmarks": {
    "arith-validation": {
      "num_problems": 3,
      "mean@n": 0.4583333333333333,
      "pass@1": 0.4583333333333332,
      "pass@4": 0.9523809523809524,
      "pass@8": 1.0,
      "counts": {
        "arith-L4-4b95582db72c": 5,
        "arith-L4-49a132f878e2": 3,
        "arith-L3-9fef915eebde": 3
      },
      "dataset": {
        "spec": "arith:validation",
        "source": "arith:validation",
        "sha256": "175a159fa1653b56986e0ecd9379b8c02f7a181e6904de3914cf879113ed183f",
        "problem_key": null,
        "answer_key": null,
        "solution_key": null,
        "split": "validation",
        "limit": 3,
        "seed": 0,
        "num_problems": 3
      },
      "skipped_long_prompts": 0
    },
    "mini": {
      "num_problems": 1,
      "mean@n": 0.0,
      "pass@1": 0.0,
      "pass@4": 0.0,
      "pass@8": 0.0,
      "counts": {
        "mini-0": 0
      },
      "dataset": {
        "spec": "data/mini.jsonl",
        "num_problems": 1
      },
      "skipped_long_prompts": 2
    }
  },
  "suite": {
    "num_problems": 4,
    "mean@n": 0.34375,
    "pass@1": 0.3437499999999999,
    "pass@4": 0.7142857142857143,
    "pass@8": 0.75
  },
  "settings": {
    "model": {
      "path": "/tmp/fresh/ggpo_offline/organism/tiny_model",
      "name": "embedded:tiny",
      "weights_sha256": "6a1a1743c863660c5410f07a591f5a44ef6233b1e04929e24a9299d67fc91e31"
    },
    "sampling": {
      "m": 8,
      "temperature": 1.0,
      "top_p": 1.0,
      "top_k": 0,
      "max_tokens": 384,
      "seed": 0,
      "seed_derivation": "per prompt: sha256('{seed}:{prompt_id}'), engine adds the sample index"
    },
    "pool": "pools/base.parquet",
    "engine": {
      "name": "vllm",
      "version": "0.32.0"
    },
    "dtype": "float32",
    "reward": {
      "extraction_rule": "last_boxed",
      "verifier": null,
      "timeout_s": 5.0,
      "timeouts": 0,
      "errors": 0
    },
    "dataset_seed": 0,
    "tool_version": "0.1.0"
  },
  "run": {
    "created": "2026-12-03T12:35:06+00:00",
    "seconds": 64.67
  }
}
"""


def test_a_written_report_reads_back_typed_and_writes_the_same_bytes():
    report = EvalReport.from_dict(json.loads(WRITTEN_REPORT))
    assert json.dumps(report.to_dict(), indent=2) + "\n" == WRITTEN_REPORT  # keys, order and values
    assert pickle.loads(pickle.dumps(report)) == report  # as it crosses the remote evaluator's pipe
    bench = report.benchmarks["arith-validation"]
    assert (report.n, report.ks, list(report.benchmarks)) == (8, (1, 4, 8), ["arith-validation", "mini"])
    assert bench.num_problems == 3 and bench.mean_at_n == 0.4583333333333333
    assert bench.pass_at_k == {1: 0.4583333333333332, 4: 0.9523809523809524, 8: 1.0}
    assert bench.counts["arith-L4-4b95582db72c"] == 5 and report.benchmarks["mini"].skipped_long_prompts == 2
    assert report.suite.num_problems == 4 and report.suite.pass_at_k[8] == 0.75
    assert report.settings.model.name == "embedded:tiny" and report.run["seconds"] == 64.67
    benchmarks, suite = aggregate({name: b.counts for name, b in report.benchmarks.items()}, 8, (1, 4, 8))
    assert suite == report.suite  # the scores are those the evaluator computes from the counts
    assert benchmarks == {
        name: replace(b, dataset=None, skipped_long_prompts=None) for name, b in report.benchmarks.items()
    }
    # Scores computed from counts alone (no dataset recorded) round-trip without those keys.
    benchmarks, suite = aggregate({"b": {"p": 1}}, 2, (1, 2))
    alone = EvalReport(2, (1, 2), benchmarks, suite, settings=report.settings, run={}).to_dict()
    assert list(alone["benchmarks"]["b"]) == ["num_problems", "mean@n", "pass@1", "pass@2", "counts"]
    assert EvalReport.from_dict(alone).to_dict() == alone


def test_sampling_settings_come_from_the_pool_unless_given(tmp_path):
    meta = {
        "schema_version": 1,
        "sampling": {"m": 4, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_tokens": 96, "seed": 3},
        "prompt_template": {"kind": "chat"},
        "dtype": "bfloat16",
    }
    pool = write_synthetic_pool(tmp_path / "p.parquet", metadata=meta)
    sampling, template, dtype = resolve_sampling(EvalConfig(pool=pool, n=16, seed=5))
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_tokens) == (0.7, 0.9, 20, 96)
    assert (sampling.m, sampling.seed, template, dtype) == (16, 5, "chat", "bfloat16")
    given = EvalConfig(pool=pool, temperature=1.0, top_k=0, template="plain", dtype="float32")
    sampling, template, dtype = resolve_sampling(given)
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_tokens) == (1.0, 0.9, 0, 96)
    assert (template, dtype) == ("plain", "float32")
    sampling, template, dtype = resolve_sampling(EvalConfig(max_tokens=64))
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_tokens) == (1.0, 1.0, 0, 64)
    assert (sampling.m, template, dtype) == (32, "auto", "auto")
    bare = write_synthetic_pool(tmp_path / "bare.parquet")
    with pytest.raises(UserError, match="no sampling.temperature"):
        resolve_sampling(EvalConfig(pool=bare))
    with pytest.raises(UserError, match="no such pool file"):
        resolve_sampling(EvalConfig(pool=tmp_path / "missing.parquet"))


def test_bad_benchmark_lists_fail_before_any_model_is_loaded(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "x.jsonl").write_text(json.dumps({"problem": "1 + 1?", "answer": "2"}) + "\n")
    specs = (str(tmp_path / "a" / "x.jsonl"), str(tmp_path / "b" / "x.jsonl"))
    with pytest.raises(UserError, match="both named 'x'"):
        evaluate(EvalConfig(datasets=specs, model=str(tmp_path / "no-model")))
    with pytest.raises(UserError, match="given twice"):
        evaluate(EvalConfig(datasets=("arith:test", "arith:test")))
    with pytest.raises(UserError, match="--ks values must be >= 1, got -2"):
        evaluate(EvalConfig(ks=(1, -2)))


@pytest.mark.vllm
def test_evaluate_end_to_end_with_vllm(vllm_engine, tmp_path):
    data = tmp_path / "mini.jsonl"
    rows = [{"problem": "What is 2 + 3?", "answer": "5"}, {"problem": "What is 7 - 4?", "answer": "3"}]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = EvalConfig(
        datasets=("arith:test", str(data)),
        num_problems=4,
        n=4,
        ks=(1, 2, 4, 8),
        max_tokens=64,
        seed=11,
        reward_workers=0,
        batch_prompts=4,
        out=tmp_path / "report.json",
    )
    seen = []
    report = evaluate(config, engine=vllm_engine, on_progress=lambda p: seen.append(p.problems_done))
    assert seen == [4, 6]
    assert config.out.read_text() == json.dumps(report.to_dict(), indent=2) + "\n"
    assert EvalReport.from_dict(json.loads(config.out.read_text())) == report
    assert list(report.benchmarks) == ["arith-test", "mini"] and report.ks == (1, 2, 4)
    sizes = {"arith-test": 4, "mini": 2}
    for name, bench in report.benchmarks.items():
        counts = bench.counts
        assert len(counts) == bench.num_problems == sizes[name]
        assert all(isinstance(c, int) and 0 <= c <= 4 for c in counts.values())
        assert bench.mean_at_n == pytest.approx(sum(counts.values()) / (4 * len(counts)), abs=1e-12)
        assert bench.pass_at_k[1] == pytest.approx(bench.mean_at_n, abs=1e-12)
        assert bench.mean_at_n <= bench.pass_at_k[2] <= bench.pass_at_k[4]
        assert bench.dataset is not None and bench.skipped_long_prompts == 0
    _, suite = aggregate({k: b.counts for k, b in report.benchmarks.items()}, report.n, report.ks)
    assert suite == report.suite and report.suite.num_problems == 6
    settings = report.settings
    assert settings.engine["name"] == "vllm" and len(settings.model.weights_sha256) == 64
    assert settings.sampling.m == 4 and settings.sampling.max_tokens == 64

    again = evaluate(replace(config, out=None), engine=vllm_engine)  # the engine was left running
    assert replace(again, run={}) == replace(report, run={})


def test_a_lent_protocol_matches_a_fresh_evaluation_and_shares_its_results(vllm_engine, tiny_dir, tmp_path):
    """The test protocol borrows the validation protocol's engine (ggpo train's end-of-run test): its counts
    equal a stand-alone evaluation's, the engine gets its weights back, and protocols lent twice do not
    sample the same weights twice (each run's base model, once per comparison)."""
    from ggpo_offline.evaluate.evaluator import Evaluator

    validation = EvalConfig(datasets=("arith:validation",), num_problems=4, n=4, ks=(1,), max_tokens=64,
                            reward_workers=0)  # fmt: skip
    test = replace(validation, datasets=("arith:test",), num_problems=5)
    fresh = evaluate(test, engine=vllm_engine)
    with Evaluator(validation, vllm_engine) as lender:
        first = lender.evaluate(tiny_dir)
        with lender.lend(test) as lent:
            assert lent.evaluate(tiny_dir).benchmarks == fresh.benchmarks
        calls = []
        original = vllm_engine.generate
        vllm_engine.generate = lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs)
        try:
            with lender.lend(test) as again:
                assert again.evaluate(tiny_dir).benchmarks == fresh.benchmarks
            assert calls == []  # served from the first lent evaluation
            with lender.lend(replace(test, n=2)) as other:  # another protocol samples afresh
                other.evaluate(tiny_dir)
            assert calls
        finally:
            vllm_engine.generate = original
        assert lender.evaluate(tiny_dir).benchmarks == first.benchmarks


def test_eval_command_with_the_hf_engine(tmp_path):
    out = tmp_path / "report.json"
    args = ["eval", "--engine", "hf", "--num-problems", "3", "-n", "2", "-k", "1,2", "--max-tokens", "48"]
    result = ggpo(*args, "--reward-workers", "0", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "arith-test" in result.stdout and "suite" in result.stdout and "pass@2" in result.stdout
    assert "ended at EOS, NLL" in result.stdout and "novelty against the pool: give --pool" in result.stdout
    report = json.loads(out.read_text())
    assert report["n"] == 2 and report["ks"] == [1, 2]
    assert len(report["benchmarks"]["arith-test"]["counts"]) == 3
    assert report["settings"]["engine"]["name"] == "hf"

    before = out.read_bytes()
    assert_one_error_line(ggpo_here(*args, "--out", str(out)), "already exists; pass --overwrite")
    assert out.read_bytes() == before


def test_eval_command_bad_flags_are_one_line(tmp_path):
    assert_one_error_line(ggpo_here("eval", "-k", "0"), "--ks values must be >= 1, got 0")
    assert_one_error_line(
        ggpo_here("eval", "--dataset", str(tmp_path / "none.jsonl")), "dataset file not found"
    )


def test_a_checkpoints_weights_fingerprint_ignores_its_resume_state(tmp_path, tiny_dir):
    """Found when two runs of equal weights in two report folders recorded two fingerprints: the resume
    state beside the weights (optimizer, settings, paths) was hashed with them."""
    first, second = tmp_path / "first", tmp_path / "second"
    for folder, state in ((first, b"run one"), (second, b"run two")):
        shutil.copytree(tiny_dir, folder)
        (folder / "trainer_state.pt").write_bytes(state)
        (folder / "rank-000.pt").write_bytes(state)
    assert weights_sha256(first) == weights_sha256(second) == weights_sha256(tiny_dir)
    (second / "model.safetensors").write_bytes(b"other weights")
    assert weights_sha256(second) != weights_sha256(first)
    torch_only = tmp_path / "torch-only"  # a folder of .pt weights alone is still fingerprinted by them
    torch_only.mkdir()
    (torch_only / "weights.pt").write_bytes(b"w")
    before = weights_sha256(torch_only)
    (torch_only / "weights.pt").write_bytes(b"v")
    assert weights_sha256(torch_only) != before
