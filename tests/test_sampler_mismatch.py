"""The sampler's mismatch with the learner as a dial: its measures' exact values, a temperature the learner
does not apply recorded in the pool and made real, and the measure a run logs at update 0."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import hf_pool_config

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.model_io import initial_model_dir, load_tokenizer
from ggpo_offline.generate.engines import SamplingSettings
from ggpo_offline.generate.pipeline import generate_pool
from ggpo_offline.generate.resample import prompt_source
from ggpo_offline.pool.source import open_pool, read_pool_info
from ggpo_offline.train.logprobs import response_logprobs
from ggpo_offline.train.metric_names import SAMPLER_METRICS
from ggpo_offline.train.minibatch import MinibatchReader
from ggpo_offline.train.pi0_cache import ensure_pi0_cache
from ggpo_offline.train.pool_index import check_pool, learner_temperature
from ggpo_offline.train.sampler_mismatch import measure, pool_mismatch


def test_the_measures_equal_their_formulas_on_two_responses():
    """λ = log π − log μ on the masked tokens: 0.1, −1.0 (first response), 0.0 (second); padding ignored."""
    logp = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -7.0, -7.0]], dtype=torch.float64)
    behavior = torch.tensor([[-1.1, -1.0, -1.0], [-0.5, -3.0, -3.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    lam = np.array([-1.0 + 1.1, -2.0 + 1.0, 0.0])
    p, mu = np.exp([-1.0, -2.0, -0.5]), np.exp([-1.1, -1.0, -0.5])
    weights = np.exp([lam[0] + lam[1], lam[2]])  # sequence weights exp(Σ_t λ_t)

    found = measure(logp, behavior, mask)

    assert found.abs_log_ratio == pytest.approx(np.abs(lam).mean(), rel=1e-12)
    assert found.k3 == pytest.approx(np.mean(np.exp(lam) - lam - 1), rel=1e-12)  # sign matters: not symmetric
    assert found.probs_diff == pytest.approx(np.abs(p - mu).mean(), rel=1e-12)
    assert found.mult_prob_error == pytest.approx(np.exp(np.abs(lam)).mean(), rel=1e-12)
    assert found.ess == pytest.approx(weights.sum() ** 2 / (2 * (weights**2).sum()), rel=1e-12)
    assert [found.ratio_p05, found.ratio_p50, found.ratio_p95] == pytest.approx(
        np.quantile(np.exp(lam), [0.05, 0.5, 0.95]), rel=1e-12
    )
    assert found.outside == pytest.approx(1 / 3)  # exp(−1) < 0.5
    assert (found.responses, found.tokens) == (2, 3)
    assert list(found.metrics()) == list(SAMPLER_METRICS)
    assert found.metrics()["sampler/k3"] == found.k3 and found.metrics()["sampler/outside"] == found.outside


def test_ratio_quantiles_read_the_learner_over_the_sampler():
    """A learner that rates every sampled token higher than the sampler did has ratios above 1."""
    found = measure(torch.full((1, 4), -1.0), torch.full((1, 4), -1.5), torch.ones(1, 4))
    assert found.ratio_p50 == pytest.approx(math.exp(0.5)) and found.k3 > 0 and found.outside == 0


@pytest.fixture(scope="module")
def pools(tmp_path_factory) -> dict[str, object]:
    """The same prompts and seed sampled at τ = 0.7 for a learner that applies it, and for one at 1."""
    folder = tmp_path_factory.mktemp("doses")
    sampling = SamplingSettings(m=4, max_tokens=48, seed=5, temperature=0.7)
    matched = hf_pool_config(folder / "matched.parquet", num_prompts=8, sampling=sampling)
    return {
        "matched": generate_pool(matched),
        "dose": generate_pool(replace(matched, out=folder / "dose.parquet", learner_temperature=1.0)),
    }


def _logprobs_at(pool, temperature: float) -> tuple[torch.Tensor, object]:
    """The initial model's log-probs of the pool's responses at ``temperature``, and the batch."""
    from transformers import AutoModelForCausalLM

    checked = check_pool(pool)
    model_dir = initial_model_dir(None, checked.info.model.location)
    batch = MinibatchReader(pool, checked.index, load_tokenizer(model_dir).pad_token_id or 0).read(
        checked.index.mixed_group_ids.tolist()
    )
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return response_logprobs(model, batch, temperature=temperature)[0], batch


def test_a_learner_temperature_is_recorded_and_the_learner_computes_at_it(pools):
    """The dose pool stores the sampler's log-probs at τ = 0.7 and a learner at 1: π0 is scored at 1, so the
    mismatch is the temperature's alone; the same responses sampled for a learner at 0.7 show none."""
    info = read_pool_info(pools["dose"])
    assert (info.sampling.temperature, info.sampling.learner_temperature) == (0.7, 1.0)
    assert "learner_temperature" not in info.config  # recorded once, with the sampling settings
    assert learner_temperature(pools["dose"], info.sampling) == 1.0
    assert learner_temperature(pools["matched"], read_pool_info(pools["matched"]).sampling) == 0.7
    assert "learner_temperature" not in read_pool_info(pools["matched"]).to_metadata()["sampling"]

    at_1, batch = _logprobs_at(pools["dose"], 1.0)
    at_07, _ = _logprobs_at(pools["dose"], 0.7)
    on = batch.mask.bool()
    assert torch.allclose(batch.behavior_logp[on], at_07[on], atol=1e-5)  # the sampler's are at τ
    checked, cache = ensure_pi0_cache(pools["dose"])
    assert torch.allclose(cache.logprobs(batch)[on], at_1[on], atol=1e-5)  # the learner's at its own

    dose = pool_mismatch(checked, cache)
    expected = measure(at_1, batch.behavior_logp, batch.mask)
    # The embedded model puts ~all mass on most tokens, so τ < 1 moves few of them: 7e-4 here (results.md).
    assert dose.abs_log_ratio == pytest.approx(expected.abs_log_ratio, rel=1e-6) and dose.abs_log_ratio > 1e-4
    assert dose.k3 == pytest.approx(expected.k3, rel=1e-6) and dose.k3 > 1e-6
    matched = pool_mismatch(*ensure_pi0_cache(pools["matched"]))
    assert matched.abs_log_ratio < 1e-6 and matched.ess == pytest.approx(1.0, abs=1e-6)


def test_a_run_logs_its_pools_mismatch_at_update_0_and_its_rounds_keep_the_dose(pools, tmp_path):
    from ggpo_offline.train.config import TrainConfig
    from ggpo_offline.train.trainer import train

    config = TrainConfig(
        pool=pools["dose"], method="grpo", updates=2, groups_per_batch=1, no_tracking=True, out=tmp_path
    )
    metrics = train(config).metrics
    expected = pool_mismatch(*ensure_pi0_cache(pools["dose"])).metrics()
    assert {name: metrics[0][name] for name in SAMPLER_METRICS} == expected
    assert metrics[0]["mismatch/drift"] > 1e-4  # the first minibatch shows the dose too
    assert not any(name in metrics[1] for name in SAMPLER_METRICS)

    source = prompt_source(open_pool(pools["dose"]), None)
    assert source.settings["learner_temperature"] == 1.0 and source.settings["temperature"] == 0.7


def test_a_learner_temperature_out_of_range_is_refused_in_one_line(tmp_path):
    with pytest.raises(UserError, match=r"^--learner-temperature must be > 0, got 0.0$"):
        hf_pool_config(tmp_path / "p.parquet", learner_temperature=0.0)
