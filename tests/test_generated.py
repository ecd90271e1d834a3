"""The generated-text diagnostics of an evaluation: exact values on hand-made samples, the pool's support read
from its file, and a model forced outside that support flagged where the base model is not."""

import json
import math
import shutil
from dataclasses import replace

import numpy as np
import pytest
from conftest import eval_settings, synthetic_rows, write_synthetic_pool

from ggpo_offline.evaluate.config import EvalConfig
from ggpo_offline.evaluate.eval_report import EvalReport
from ggpo_offline.evaluate.evaluator import Evaluator
from ggpo_offline.evaluate.generated import GeneratedText, PoolSupport
from ggpo_offline.generate.engines import Sample
from ggpo_offline.train.evaluation import eval_metrics


def test_diagnostics_of_hand_made_samples_are_exact():
    support = PoolSupport.of_responses([[5, 6, 7], [8, 6], [5]])
    assert support.first_tokens.tolist() == [5, 8]
    # (5, 6), (6, 7), (8, 6): not (7, 8) nor (6, 5), which straddle two responses
    assert sorted((int(k) >> 32, int(k) & 0xFFFFFFFF) for k in support.bigrams) == [(5, 6), (6, 7), (8, 6)]
    generated = GeneratedText(support)
    generated.add([Sample([5, 6, 9], [-0.5, -1.0, -1.5], "stop"), Sample([9, 5], [-2.0, -1.0], "length")])
    generated.add([Sample([8, 6, 7, 8], [-0.25] * 4, "stop")])
    assert generated.to_dict() == {
        "mean_length": 9 / 3,
        "stop_rate": 2 / 3,
        "nll": (0.5 + 1.0 + 1.5 + 2.0 + 1.0 + 1.0) / 9,
        "novel_first_token": 1 / 3,  # 9 opens no pool response
        # bigrams (5,6) (6,9) | (9,5) | (8,6) (6,7) (7,8): (6,9), (9,5), (7,8) are new
        "novel_bigram": 3 / 6,
    }
    alone = GeneratedText()  # without a pool: no novelty
    alone.add([Sample([5], [-1.0], "stop")])
    assert alone.to_dict()["novel_first_token"] is None and alone.to_dict()["novel_bigram"] is None


def test_a_pools_support_is_read_from_its_token_ids(tmp_path):
    rows = synthetic_rows(groups=7, m=3, seed=2)
    pool = write_synthetic_pool(tmp_path / "p.parquet", rows=rows, rows_per_group_chunk=5)
    read = PoolSupport.of_pool(pool)
    expected = PoolSupport.of_responses([row["response_token_ids"] for row in rows])
    assert np.array_equal(read.first_tokens, expected.first_tokens)
    assert np.array_equal(read.bigrams, expected.bigrams) and len(read.bigrams) > 20


def test_a_report_with_generated_diagnostics_round_trips_and_logs_them():
    text = {
        "n": 1, "ks": [1],
        "benchmarks": {"b": {"num_problems": 2, "mean@n": 0.5, "pass@1": 0.5, "counts": {"p": 1, "q": 0}}},
        "suite": {"num_problems": 2, "mean@n": 0.5, "pass@1": 0.5},
        "settings": eval_settings().to_dict(), "run": {},
        "generated": {"mean_length": 3.0, "stop_rate": 1.0, "nll": 0.7, "novel_first_token": None,
                      "novel_bigram": None},
    }  # fmt: skip
    report = EvalReport.from_dict(text)
    assert report.to_dict() == text and list(report.to_dict()) == list(text)
    metrics = eval_metrics(report)
    assert metrics["eval/generated/nll"] == 0.7 and metrics["eval/generated/mean_length"] == 3.0
    assert "eval/generated/novel_first_token" not in metrics  # None: measured without a pool


def _forced_outside(tiny_dir, out):
    """The embedded model with its final norm zeroed: every logit is 0, so it samples uniformly over the
    vocabulary, opening with tokens the pool's responses never open with."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny_dir, out)
    weights = load_file(str(out / "model.safetensors"))
    weights["model.norm.weight"].zero_()
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.vllm
def test_a_model_forced_outside_the_pools_support_is_flagged_and_the_base_model_is_not(
    vllm_engine, vllm_pool, tiny_dir, tmp_path
):
    config = EvalConfig(datasets=("arith:validation",), num_problems=16, n=4, max_tokens=64, reward_workers=0,
                        pool=vllm_pool)  # fmt: skip
    forced = _forced_outside(tiny_dir, tmp_path / "forced")
    with Evaluator(config, vllm_engine) as evaluator:
        base = evaluator.evaluate(tiny_dir).generated
        outside = evaluator.evaluate(forced).generated
    assert base["novel_first_token"] <= 0.05 and base["novel_bigram"] <= 0.05
    assert outside["novel_first_token"] >= 0.8 and outside["novel_bigram"] >= 0.5
    vocabulary = json.loads((tiny_dir / "config.json").read_text())["vocab_size"]
    assert outside["nll"] == pytest.approx(math.log(vocabulary), abs=1e-4)  # uniform sampling
    assert base["nll"] < 1.0 < outside["nll"]
    assert 0 < outside["stop_rate"] < base["stop_rate"]  # EOS is one token in a hundred, not the model's end
    # without a pool, the same evaluation has no novelty to report
    with Evaluator(replace(config, pool=None, temperature=1.0, top_p=1.0, top_k=0), vllm_engine) as bare:
        alone = bare.evaluate(tiny_dir).generated
    assert alone["novel_first_token"] is None and alone["nll"] == base["nll"]
