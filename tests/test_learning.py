"""Learners learn: a few updates on a pool of the embedded model favour the behaviours of correct responses on
held-out groups, and a learner whose loss is flipped or whose gradient is zeroed fails the same check."""

import functools
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM

from ggpo_offline.train import losses
from ggpo_offline.train.batch import MinibatchReader
from ggpo_offline.train.config import resolve_config
from ggpo_offline.train.learners import LEARNERS, METHODS
from ggpo_offline.train.logprobs import response_logprobs
from ggpo_offline.train.plan import index_pool, plan_minibatches
from ggpo_offline.train.trainer import train

UPDATES, GROUPS = 6, 4
# The tiny preset's learning rate and anchors: the check is that the demo's own settings learn.
MIN_GAIN = 0.05  # nats of first-token log-prob, correct minus incorrect, averaged over held-out groups


@pytest.fixture(scope="module")
def learning_pool(tmp_path_factory):
    """64 train problems x 8 responses of the embedded model, hf engine in float32."""
    from ggpo_offline.generate.engines import SamplingSettings
    from ggpo_offline.generate.pipeline import GenerateConfig, generate_pool

    config = GenerateConfig(
        num_prompts=64,
        sampling=SamplingSettings(m=8, max_tokens=96, seed=11),
        engine="hf",
        dtype="float32",
        out=tmp_path_factory.mktemp("learning") / "pool.parquet",
        reward_workers=0,
    )
    return generate_pool(config)


def _held_out_groups(pool) -> list[int]:
    """Mixed groups that no run of the test trains on (the plan of seed 0 takes the first ones it draws)."""
    index = index_pool(pool)
    trained = set(plan_minibatches(index, 0, UPDATES, GROUPS).ravel().tolist())
    return [group for group in index.mixed_group_ids.tolist() if group not in trained]


@torch.no_grad()
def correct_minus_incorrect(model_dir, pool, group_ids: list[int]) -> float:
    """Mean over groups of (mean log-prob of its correct responses' first token - that of its incorrect ones).

    The first token is where the embedded model picks its behaviour. Whole-sequence log-probs are no use
    here: on the previous build, whose correct responses were mostly long careful chains, any update that
    sharpened the model widened their gap, whatever its sign (a sign-flipped GGPO widened it more)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    batch = MinibatchReader(pool, index_pool(pool), pad_id=0).read(group_ids)
    logp, _ = response_logprobs(model, batch)
    sequence = logp[:, 0].reshape(-1, batch.group_size)
    correct = batch.rewards.reshape(-1, batch.group_size) > 0
    gaps = [row[right].mean() - row[~right].mean() for row, right in zip(sequence, correct, strict=True)]
    return float(torch.stack(gaps).mean())


def _gain(method: str, pool, tmp_path, tiny_dir) -> float:
    """How much UPDATES updates of ``method`` (tiny preset) widen the held-out correct-incorrect gap."""
    config = replace(
        resolve_config("tiny", method=method),
        pool=pool,
        updates=UPDATES,
        groups_per_batch=GROUPS,
        seed=0,
        eval_every=None,
        no_tracking=True,
        out=tmp_path / method,
    )
    held_out = _held_out_groups(pool)
    before = correct_minus_incorrect(tiny_dir, pool, held_out)
    return correct_minus_incorrect(train(config).final_model, pool, held_out) - before


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_every_learner_favours_correct_responses_on_held_out_groups(
    learning_pool, tmp_path, tiny_dir, method
):
    assert len(_held_out_groups(learning_pool)) >= 16
    assert _gain(method, learning_pool, tmp_path, tiny_dir) > MIN_GAIN


def _flipped(loss_fn):
    @functools.wraps(loss_fn)
    def flipped(*args, **kwargs):
        out = loss_fn(*args, **kwargs)
        return losses.LossOutput(-out.loss, out.stats)

    return flipped


def _zeroed(loss_fn):
    @functools.wraps(loss_fn)
    def zeroed(*args, **kwargs):
        out = loss_fn(*args, **kwargs)
        return losses.LossOutput(out.loss * 0.0, out.stats)

    return zeroed


@pytest.mark.slow
@pytest.mark.parametrize("mutation", [_flipped, _zeroed], ids=["flipped-sign", "zeroed-gradient"])
@pytest.mark.parametrize("method", ["ggpo", "grpo"])
def test_a_mutated_learner_fails_the_check(learning_pool, tmp_path, tiny_dir, monkeypatch, method, mutation):
    name = LEARNERS[method].loss_name
    monkeypatch.setattr(losses, name, mutation(getattr(losses, name)))
    assert not _gain(method, learning_pool, tmp_path, tiny_dir) > MIN_GAIN
