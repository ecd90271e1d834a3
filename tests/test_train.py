"""The replay trainer: data plan, log-probs, determinism, resume, the update-0 physics check, errors."""

import functools
import json
import math
from dataclasses import replace

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import count_pool_passes, eval_settings, synthetic_rows, write_synthetic_pool

from ggpo_offline.core.errors import UserError
from ggpo_offline.core.settings import replace_settings
from ggpo_offline.pool.schema import METADATA_KEY
from ggpo_offline.train.config import TrainConfig
from ggpo_offline.train.learners import LEARNERS
from ggpo_offline.train.logprobs import full_vocab_logprobs, length_buckets, response_logprobs
from ggpo_offline.train.minibatch import MinibatchReader
from ggpo_offline.train.pool_index import data_order_fingerprint, index_pool, plan_minibatches
from ggpo_offline.train.run_folder import RunFolder
from ggpo_offline.train.trainer import train
from ggpo_offline.train.training_presets import resolve_config


def _config(pool, tmp_path, **changes) -> TrainConfig:
    base = TrainConfig(
        pool=pool,
        updates=4,
        groups_per_batch=2,
        lr=1e-4,
        no_tracking=True,
        out=tmp_path / "run",
        ref_refresh=2,
    )
    return replace_settings(base, **changes)


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_plan_uses_each_mixed_group_once_and_depends_only_on_pool_and_seed(tmp_path):
    rows = synthetic_rows(groups=30, m=4, seed=5)
    path = write_synthetic_pool(tmp_path / "p.parquet", rows=rows, rows_per_group_chunk=6)  # groups straddle
    index = index_pool(path)
    correct = np.array([r["reward"] for r in rows]).reshape(30, 4).sum(axis=1)
    assert index.mixed_group_ids.tolist() == [g for g in range(30) if 0 < correct[g] < 4]
    assert all(len(index.row_groups_of[g]) >= 1 for g in index.mixed_group_ids.tolist())
    plan = plan_minibatches(index, seed=1, updates=3, groups_per_batch=4)
    assert plan.shape == (3, 4) and len(set(plan.ravel().tolist())) == 12
    assert set(plan.ravel().tolist()) <= set(index.mixed_group_ids.tolist())
    assert np.array_equal(plan, plan_minibatches(index_pool(path), seed=1, updates=3, groups_per_batch=4))
    assert data_order_fingerprint(plan) != data_order_fingerprint(plan_minibatches(index, 2, 3, 4))
    n = len(index.mixed_group_ids)
    with pytest.raises(
        UserError, match=f"the pool has {n} mixed-reward groups but 10 updates x 4 groups need 40"
    ):
        plan_minibatches(index, seed=1, updates=10, groups_per_batch=4)


def test_minibatch_rows_follow_the_plan_and_split_on_group_boundaries(tmp_path):
    rows = synthetic_rows(groups=10, m=4, seed=5)
    path = write_synthetic_pool(tmp_path / "p.parquet", rows=rows, rows_per_group_chunk=12)
    index = index_pool(path)
    chosen = index.mixed_group_ids[[2, 0, 1]].tolist()
    batch = MinibatchReader(path, index, pad_id=0).read(chosen)
    expected = [r for g in chosen for r in rows if r["group_id"] == g]
    for i, row in enumerate(expected):
        n = len(row["response_token_ids"])
        assert batch.response_ids[i, :n].tolist() == row["response_token_ids"]
        assert batch.mask[i].sum() == n and batch.rewards[i] == row["reward"]
        torch.testing.assert_close(batch.behavior_logp[i, :n], torch.tensor(row["behavior_logprobs"]))
    micro = batch.split(5)  # rounded down to whole groups of 4
    assert [m.num_responses for m in micro] == [4, 4, 4]
    assert sorted(g for m in micro for g in m.group_ids) == sorted(chosen)
    widths = [m.input_ids.shape[1] for m in micro]
    assert widths == sorted(widths) and widths[-1] == batch.input_ids.shape[1]  # length-sorted, trimmed
    for m in micro:  # each micro-batch holds its groups' rows unchanged, cut to its own longest row
        (g,) = m.group_ids
        source = chosen.index(g) * 4
        assert m.input_ids.shape[1] == int(m.attention_mask.sum(dim=1).max())
        assert torch.equal(m.input_ids, batch.input_ids[source : source + 4, : m.input_ids.shape[1]])
        assert torch.equal(m.mask, batch.mask[source : source + 4, : m.mask.shape[1]])


def test_response_logprobs_equal_a_per_row_forward_pass(vllm_pool, tiny_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32).eval()
    index = index_pool(vllm_pool)
    batch = MinibatchReader(vllm_pool, index, pad_id=0).read(index.mixed_group_ids[:2].tolist())
    logp, entropy = response_logprobs(model, batch, with_entropy=True)
    for i in range(batch.num_responses):
        P, n = int(batch.prompt_lengths[i]), int(batch.mask[i].sum())
        ids = batch.input_ids[i : i + 1, : P + n]
        with torch.no_grad():
            logits = model(ids).logits[0, P - 1 : P + n - 1]
        expected = torch.log_softmax(logits, -1).gather(-1, ids[0, P:, None])[:, 0]
        torch.testing.assert_close(logp[i, :n].detach(), expected, atol=1e-5, rtol=0)
        assert torch.all(logp[i, n:] == 0) and torch.all(entropy[i, :n] > 0)


@pytest.mark.parametrize(("chunk_tokens", "forward_tokens"), [(1024, 10**9), (37, 1), (512, 300)])
def test_chunked_logprobs_equal_the_full_vocabulary_computation(
    vllm_pool, tiny_dir, chunk_tokens, forward_tokens
):
    """Values, entropy, GGPO loss and every parameter gradient match the straightforward padded path in
    fp32, whether the rows run in one forward, one forward each, or length-sorted forwards."""
    from transformers import AutoModelForCausalLM

    from ggpo_offline.train.losses import ggpo_loss

    model = AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32)
    index = index_pool(vllm_pool)
    batch = MinibatchReader(vllm_pool, index, pad_id=0).read(index.mixed_group_ids[:3].tolist())
    mask = batch.mask
    results = []
    chunked = functools.partial(response_logprobs, chunk_tokens=chunk_tokens, forward_tokens=forward_tokens)
    for compute in (full_vocab_logprobs, chunked):
        model.zero_grad()
        logp, entropy = compute(model, batch, with_entropy=True)
        out = ggpo_loss(
            logp, batch.behavior_logp, mask, batch.rewards, group_size=batch.group_size, beta=0.01
        )
        out.loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        results.append((logp.detach(), entropy, out.loss.detach(), grads))
    (logp_a, ent_a, loss_a, grads_a), (logp_b, ent_b, loss_b, grads_b) = results
    torch.testing.assert_close(logp_b, logp_a, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_b, ent_a, atol=1e-5, rtol=0)
    torch.testing.assert_close(loss_b, loss_a, atol=1e-6, rtol=1e-6)
    for grad_a, grad_b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(grad_b, grad_a, atol=1e-6, rtol=1e-4)
    with torch.no_grad():  # the reference / old-policy passes
        torch.testing.assert_close(chunked(model, batch)[0], logp_a, atol=1e-5, rtol=0)


def test_length_buckets_sort_rows_longest_first_within_the_forward_budget():
    lengths = [5, 40, 12, 40, 7, 100, 12]
    buckets = length_buckets(lengths, forward_tokens=80)
    assert buckets == [[5], [1, 3], [2, 6, 4, 0]]  # 100 alone (over budget), 2 x 40, 4 x 12 <= 80
    assert length_buckets(lengths, forward_tokens=10**6) == [[5, 1, 3, 2, 6, 4, 0]]
    assert length_buckets(lengths, forward_tokens=1) == [[5], [1], [3], [2], [6], [4], [0]]


@pytest.mark.parametrize("no_packing", [False, True], ids=["packed", "padded"])
def test_update_zero_mismatch_is_exactly_zero_on_a_float32_hf_pool(hf_pool, tmp_path, no_packing):
    """Physics check: the learner at update 0 is the behavior policy, so K3 = drift = 0 and ESS = 1."""
    result = train(_config(hf_pool, tmp_path, updates=1, method="ggpo", no_packing=no_packing))
    first = result.metrics[0]
    assert first["update"] == 0
    assert abs(first["mismatch/k3"]) < 1e-6 and abs(first["mismatch/drift"]) < 1e-6
    assert first["mismatch/ess"] == pytest.approx(1.0, abs=1e-6)
    assert first["ref/log_ratio"] == pytest.approx(0.0, abs=1e-6)
    assert first["sampler/abs_log_ratio"] < 1e-6 and first["sampler/k3"] < 1e-6  # over the whole pool
    assert first["sampler/ess"] == pytest.approx(1.0, abs=1e-6) and first["sampler/outside"] == 0


def test_update_zero_mismatch_is_zero_on_a_pool_sampled_at_temperature_07(tmp_path):
    """The engine stored log-probs of softmax(logits / 0.7); the learner, π_old and π0 divide by 0.7 too."""
    from ggpo_offline.generate.engines import SamplingSettings
    from ggpo_offline.generate.pipeline import GenerateConfig, generate_pool

    sampling = SamplingSettings(m=4, max_tokens=64, seed=5, temperature=0.7)
    generated = GenerateConfig(
        num_prompts=12, sampling=sampling, engine="hf", dtype="float32", out=tmp_path / "t07.parquet"
    )
    pool = generate_pool(replace(generated, reward_workers=0))
    for method in ("grpo-tis", "ggpo"):
        first = train(_config(pool, tmp_path, updates=1, method=method, out=tmp_path / method)).metrics[0]
        assert abs(first["mismatch/k3"]) < 1e-6 and abs(first["mismatch/drift"]) < 1e-6, method
        assert first["mismatch/ess"] == pytest.approx(1.0, abs=1e-6)
        assert first["ref/log_ratio"] == pytest.approx(0.0, abs=1e-6)
        assert first["sampler/abs_log_ratio"] < 1e-6, method  # the learner applies the sampler's τ
    assert first["policy/entropy"] > 0


@pytest.mark.parametrize(
    "method", ["proximal-kl", "pg", "cispo", "seq-is", "is-free", "ggpo-reward-only", "rft"]
)
def test_the_second_papers_learners_start_on_policy_and_repeat_exactly(hf_pool, tmp_path, method):
    config = _config(hf_pool, tmp_path, method=method, updates=2, ref_refresh=None, out=tmp_path / "a")
    first = train(config).metrics
    assert train(replace(config, out=tmp_path / "b")).metrics == first
    assert abs(first[0]["mismatch/k3"]) < 1e-6 and abs(first[0]["mismatch/drift"]) < 1e-6
    assert first[0]["mismatch/ess"] == pytest.approx(1.0, abs=1e-6)
    sums = pl.read_parquet(hf_pool).group_by("group_id").agg(pl.col("reward").sum())["reward"]
    assert first[0]["train/filtered_frac"] == pytest.approx(((sums == 0) | (sums == 4)).mean())
    assert first[1]["mismatch/drift"] > 0  # the policy moved
    assert first[0]["sampler/abs_log_ratio"] < 1e-6  # measured without a reference: π0 scored for it
    assert not any(name.startswith("sampler/") for name in first[1])  # once, before any update
    if method in ("proximal-kl", "seq-is", "is-free"):
        assert first[0]["pkl/credit_mean"] == pytest.approx(0.0, abs=1e-6)  # π_ref = π0 = learner at update 0
        assert first[0]["pkl/credit_var"] == pytest.approx(0.0, abs=1e-6)
    if method in ("proximal-kl", "pg", "cispo", "seq-is"):
        assert first[0]["is/w_max"] == pytest.approx(1.0, abs=1e-5)


def test_learners_without_a_reference_refuse_a_refresh_interval(vllm_pool, tmp_path):
    with pytest.raises(UserError, match="--ref-refresh is not read by ggpo-reward-only; it is read by ggpo,"):
        resolve_config(None, None, method="ggpo-reward-only", ref_refresh=10)
    assert resolve_config(None, None, method="proximal-kl").ref_refresh == 160  # SPEC-beyond PROVISIONAL
    assert resolve_config(None, None, method="is-free", horizon="full").horizon is None


@pytest.mark.parametrize(
    "method", ["ggpo", "ggpo-clip", "agro", "grpo", "grpo-tis", "trl-sequence-mask", "verl-bypass-pg-is"]
)
def test_every_method_trains_and_changes_the_policy(vllm_pool, tmp_path, method):
    reference = {} if LEARNERS[method].reads("ref_refresh") else {"ref_refresh": None}
    result = train(_config(vllm_pool, tmp_path, method=method, updates=3, tis_block=2, **reference))
    assert [m["update"] for m in result.metrics] == [0, 1, 2]
    for record in result.metrics:
        assert all(np.isfinite(v) for k, v in record.items())
        assert record["mismatch/ess"] <= 1 + 1e-6 and record["mismatch/k3"] >= 0  # float32: 1 + a few ulps
    assert result.metrics[0]["mismatch/drift"] != result.metrics[-1]["mismatch/drift"]
    assert (result.final_model / "model.safetensors").is_file()


def test_same_pool_config_and_seed_give_identical_metrics_and_methods_share_the_data_order(
    vllm_pool, tmp_path
):
    first = train(_config(vllm_pool, tmp_path, out=tmp_path / "a"))
    second = train(_config(vllm_pool, tmp_path, out=tmp_path / "b"))
    assert first.metrics == second.metrics
    assert _metrics(first.run_dir) == _metrics(second.run_dir)
    grpo = train(_config(vllm_pool, tmp_path, method="grpo", out=tmp_path / "c", updates=1))
    # U differs, so does the plan length.
    assert grpo.fingerprints.data_order_fingerprint != first.fingerprints.data_order_fingerprint
    grpo = train(_config(vllm_pool, tmp_path, method="grpo", out=tmp_path / "d"))
    assert grpo.fingerprints.data_order_fingerprint == first.fingerprints.data_order_fingerprint
    other_seed = train(_config(vllm_pool, tmp_path, seed=7, out=tmp_path / "e"))
    assert other_seed.fingerprints.data_order_fingerprint != first.fingerprints.data_order_fingerprint


def test_block_ess_is_logged_at_every_block_end_whatever_the_log_interval(vllm_pool, tmp_path, monkeypatch):
    passes = count_pool_passes(monkeypatch)
    result = train(_config(vllm_pool, tmp_path, updates=5, log_every=3, ess_block=2))
    assert passes == {"validate_pool": 1, "index_pool": 1, "pool_fingerprint": 1, "pool_summary": 0}
    logged = {record["update"]: record for record in result.metrics}
    assert sorted(logged) == [0, 1, 3, 4]  # logged updates 0, 3, the last (4), and block ends 1, 3
    assert logged[1].keys() == {"update", "mismatch/ess_block"} and "mismatch/ess_block" in logged[3]
    assert "mismatch/ess_block" not in logged[0] and "mismatch/ess_block" not in logged[4]
    assert 0 < logged[1]["mismatch/ess_block"] <= 1


def test_grpo_keeps_its_initial_reference_unless_a_refresh_interval_is_given(vllm_pool, tmp_path):
    fixed = train(_config(vllm_pool, tmp_path, method="grpo", ref_refresh=None, out=tmp_path / "fixed"))
    refreshed = train(_config(vllm_pool, tmp_path, method="grpo", ref_refresh=2, out=tmp_path / "every2"))
    # At update 2 a refreshed reference is the learner itself: s − s_ref = 0; the initial one has moved away.
    assert refreshed.metrics[2]["ref/log_ratio"] == 0.0 and fixed.metrics[2]["ref/log_ratio"] != 0.0
    assert fixed.metrics[:2] == refreshed.metrics[:2]


def test_resume_reproduces_an_uninterrupted_run(vllm_pool, tmp_path):
    config = _config(
        vllm_pool, tmp_path, method="grpo-tis", updates=6, save_every=2, tis_block=4, micro_batch_size=4
    )
    full = train(replace(config, out=tmp_path / "full"))

    def crash(update, metrics):
        if update == 4:  # after the checkpoint at update 4 was written... one more step then dies
            raise KeyboardInterrupt

    interrupted = replace(config, out=tmp_path / "cut")
    with pytest.raises(KeyboardInterrupt):
        train(interrupted, on_update=crash)
    resumed = train(interrupted, resume=True)
    assert _metrics(resumed.run_dir) == _metrics(full.run_dir)
    # The profile keeps both stretches of work: up to the last flush before the crash, then the resumed one.
    profile = RunFolder(resumed.run_dir).read_profile()
    assert [t.update for t in profile if t.phase == "forward_backward"] == [0, 1, 2, 3, 4, 5]
    assert [t.phase for t in profile].count("model") == 2
    from safetensors.torch import load_file

    a, b = (
        load_file(str(full.final_model / "model.safetensors")),
        load_file(str(resumed.final_model / "model.safetensors")),
    )
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_training_errors_are_one_clear_line(vllm_pool, tmp_path):
    with pytest.raises(UserError, match="unknown method 'ppo'"):
        resolve_config(None, None, method="ppo")
    config = _config(vllm_pool, tmp_path, updates=1)
    train(config)
    with pytest.raises(UserError, match="already exists; pass --resume to continue it or --overwrite"):
        train(config)
    train(config, overwrite=True)
    with pytest.raises(UserError, match="updates x 2 groups need"):
        train(replace(config, updates=10_000, out=tmp_path / "big"))

    table = pq.read_table(vllm_pool)
    meta = json.loads(pq.read_metadata(vllm_pool).metadata[METADATA_KEY])
    meta["tokenizer"]["sha256"] = "0" * 64
    other = tmp_path / "other-tokenizer.parquet"
    pq.write_table(table.replace_schema_metadata({METADATA_KEY: json.dumps(meta)}), other)
    with pytest.raises(UserError, match="different tokenizer.*--allow-tokenizer-mismatch"):
        train(replace(config, pool=other, out=tmp_path / "tok"))
    train(replace(config, pool=other, out=tmp_path / "tok", allow_tokenizer_mismatch=True))

    meta = json.loads(pq.read_metadata(vllm_pool).metadata[METADATA_KEY])
    meta["sampling"]["top_p"] = 0.9
    truncated = tmp_path / "top-p.parquet"
    pq.write_table(table.replace_schema_metadata({METADATA_KEY: json.dumps(meta)}), truncated)
    with pytest.raises(UserError, match="sampled with top-p 0.9: .* pass --allow-truncated-sampling"):
        train(replace(config, pool=truncated, out=tmp_path / "top-p"))
    assert not (tmp_path / "top-p").exists()
    train(replace(config, pool=truncated, out=tmp_path / "top-p", allow_truncated_sampling=True))
    assert json.loads((tmp_path / "top-p" / "config.json").read_text())["allow_truncated_sampling"] is True

    responses = table.column("response_token_ids").to_pylist()
    foreign = table.set_column(
        table.schema.get_field_index("response_token_ids"),
        table.schema.field("response_token_ids"),
        pa.array([[999_999, *ids[1:]] for ids in responses], table.schema.field("response_token_ids").type),
    )
    original = {METADATA_KEY: pq.read_metadata(vllm_pool).metadata[METADATA_KEY]}
    pq.write_table(foreign.replace_schema_metadata(original), tmp_path / "foreign.parquet")
    with pytest.raises(UserError, match=r"group \d+ holds token id 999999, outside the model's vocabulary"):
        train(replace(config, pool=tmp_path / "foreign.parquet", out=tmp_path / "foreign"))

    broken = write_synthetic_pool(tmp_path / "broken.parquet", rows=synthetic_rows(3, 4)[:-1], m=4)
    with pytest.raises(UserError, match="group 2 has 3 rows"):
        train(replace(config, pool=broken, out=tmp_path / "broken"))


def test_non_finite_loss_stops_before_a_checkpoint(vllm_pool, tmp_path, monkeypatch):
    from ggpo_offline.train import losses

    real = losses.ggpo_loss

    def poisoned(*args, **kwargs):
        out = real(*args, **kwargs)
        return losses.LossOutput(out.loss * float("nan"), out.stats)

    monkeypatch.setattr(losses, "ggpo_loss", poisoned)
    config = _config(vllm_pool, tmp_path, save_every=1)
    with pytest.raises(UserError, match="non-finite loss or gradient at update 0"):
        train(config)
    assert not (config.run_dir / "checkpoints").exists()


# verl-gspo: a mean over the minibatch's responses; verl-decoupled-seq-is-norm: its weights' minibatch mean.
@pytest.mark.parametrize("method", ["ggpo", "verl-gspo", "verl-decoupled-seq-is-norm"])
def test_micro_batches_give_the_full_batch_update(vllm_pool, tmp_path, method):
    reference = {} if LEARNERS[method].reads("ref_refresh") else {"ref_refresh": None}
    settings = {"method": method, "updates": 3, **reference}
    whole = train(_config(vllm_pool, tmp_path, **settings, out=tmp_path / "whole"))
    micro = train(_config(vllm_pool, tmp_path, **settings, micro_batch_size=8, out=tmp_path / "m"))
    # Micro-batches sum the gradient in another order; Adam's division by sqrt(v) lets that last-digit
    # difference grow over updates (measured 1.9e-5 relative on ref/log_ratio at update 2), so update 0,
    # before any step, is held tighter than the later ones.
    for update, (a, b) in enumerate(zip(whole.metrics, micro.metrics, strict=True)):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-5 if update == 0 else 1e-4, abs=1e-6), key


def test_a_rejection_divides_by_the_minibatchs_kept_tokens_and_a_minibatch_kept_whole_is_stepped_past(
    vllm_pool, tmp_path
):
    """verl-bypass-pg-geo-rs rejects on π_θ/μ (band 0.999–1.001): as π_θ moves it rejects part of a minibatch,
    then all of it. Micro-batches divide by the whole minibatch's kept tokens, counted before the step, and a
    minibatch left with none has verl's NaN loss and zero gradient: the run goes on and says so."""
    settings = {"method": "verl-bypass-pg-geo-rs", "updates": 3, "ref_refresh": None}  # no π_ref
    whole = train(_config(vllm_pool, tmp_path, **settings, out=tmp_path / "whole"))
    micro = train(_config(vllm_pool, tmp_path, **settings, micro_batch_size=8, out=tmp_path / "m"))
    masked = [m["correction/masked_frac"] for m in whole.metrics]
    assert 0 < max(f for f in masked if f < 1) and masked[-1] == 1.0, masked
    assert [m["correction/none_kept"] for m in whole.metrics] == [float(f == 1.0) for f in masked]
    assert math.isnan(whole.metrics[-1]["loss"]) and math.isfinite(whole.metrics[-1]["optim/grad_norm"])
    for a, b in zip(whole.metrics, micro.metrics, strict=True):
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6, nan_ok=True), key


def test_config_precedence_defaults_preset_file_flags(tmp_path):
    path = tmp_path / "settings.toml"
    path.write_text('method = "agro"\ngroups-per-batch = 4\nref_refresh = "never"\nlr = 5e-5\n')
    config = resolve_config("tiny", path, lr=1e-3)
    assert (config.method, config.groups_per_batch, config.ref_refresh, config.lr) == ("agro", 4, None, 1e-3)
    assert config.updates == 20 and config.beta == 0.01  # preset, then SPEC default
    assert resolve_config("paper-offline").groups_per_batch == 32
    assert resolve_config(None, None, method="ggpo").ref_refresh == 160
    # GRPO keeps its fixed reference, also under a preset that tunes T_ref, unless T_ref is chosen
    assert resolve_config(None, None, method="grpo").ref_refresh is None
    assert resolve_config("tiny", None, method="grpo-tis").ref_refresh is None
    assert resolve_config("tiny", None, method="grpo", ref_refresh=320).ref_refresh == 320
    assert TrainConfig(method="grpo").ref_refresh is None and TrainConfig().ref_refresh == 160
    assert TrainConfig(method="grpo-tis", ref_refresh=160).to_dict()["ref_refresh"] == 160
    (tmp_path / "bad.toml").write_text("warmup = 3\n")
    with pytest.raises(UserError, match="unknown setting 'warmup'"):
        resolve_config(None, tmp_path / "bad.toml")
    with pytest.raises(UserError, match="unknown preset 'huge'"):
        resolve_config("huge")
    (tmp_path / "typed.yaml").write_text("updates: ten\n")
    with pytest.raises(UserError, match="updates must be int, got 'ten'"):
        resolve_config(None, tmp_path / "typed.yaml")
    (tmp_path / "lists.toml").write_text(
        'eval_datasets = ["arith:validation", "m.jsonl"]\neval-ks = "1, 4"\n'
    )
    config = resolve_config(None, tmp_path / "lists.toml", eval_n=4)
    assert (config.evaluation.eval_datasets, config.evaluation.eval_ks, config.evaluation.eval_n) == (
        ("arith:validation", "m.jsonl"),
        (1, 4),
        4,
    )
    assert config.to_dict()["eval_ks"] == [1, 4]  # as stored in config.json and compared on --resume
    (tmp_path / "badlist.toml").write_text('eval_ks = ["one"]\n')
    with pytest.raises(UserError, match="eval_ks must be a list of int"):
        resolve_config(None, tmp_path / "badlist.toml")


@pytest.mark.vllm
def test_evaluation_during_training_agrees_with_ggpo_eval_on_the_checkpoint(
    vllm_pool, vllm_engine, tiny_dir, tmp_path
):
    """In training the engine reloads weights in place; `ggpo eval` starts a fresh engine on the saved
    checkpoint. With the same seed both must count exactly the same correct responses — on validation during
    training, and on test, evaluated once at the end on a borrowed engine."""
    from test_cli import ggpo

    from ggpo_offline.evaluate.eval_report import EvalReport
    from ggpo_offline.evaluate.evaluator import Evaluator, evaluate
    from ggpo_offline.train.evaluation import eval_config, selected_update
    from ggpo_offline.train.run_folder import RunFolder

    config = _config(
        vllm_pool, tmp_path, eval_every=2, eval_n=4, eval_num_problems=12, eval_ks=(1, 2, 4), lr=2e-3,
        test_num_problems=12,
    )  # fmt: skip
    with Evaluator(eval_config(config, tiny_dir), engine=vllm_engine) as evaluator:
        result = train(config, evaluator=evaluator)
    run, folder = result.run_dir, RunFolder(result.run_dir)
    assert sorted(p.name for p in (run / "eval").glob("*.json")) == [
        f"update-00000{u}.json" for u in (0, 2, 4)
    ]
    reports = {u: json.loads(folder.eval_report(u).read_text()) for u in (0, 2, 4)}
    assert all(list(r["benchmarks"]) == ["arith-validation"] for r in reports.values())
    logged = {r["update"]: r for r in _metrics(run) if "eval/suite/mean_at_4" in r}
    assert sorted(logged) == [0, 2, 4]
    assert not any(key.startswith("eval/arith-test") for r in logged.values() for key in r)
    for update, report in reports.items():
        assert (
            logged[update]["eval/arith-validation/mean_at_4"]
            == report["benchmarks"]["arith-validation"]["mean@n"]
        )
        assert logged[update]["eval/suite/pass_at_2"] == report["suite"]["pass@2"]
    assert reports[0]["settings"]["model"]["name"] == "embedded:tiny"
    assert reports[4]["settings"]["model"]["path"] == str(run / "checkpoints" / "update-000004")
    # The run's profile: every phase it went through, in order, with its update.
    timed = [(t.phase, t.update) for t in folder.read_profile() if t.phase != "process"]
    assert timed == [
        ("inputs", None), ("pi0", None), ("model", None),
        ("probe", 0), ("evaluate", 0), ("sampler", 0), ("forward_backward", 0), ("optimizer", 0),
        ("forward_backward", 1), ("optimizer", 1), ("checkpoint", 2),
        ("probe", 2), ("evaluate", 2), ("anchors", 2), ("forward_backward", 2), ("optimizer", 2),
        ("forward_backward", 3), ("optimizer", 3), ("checkpoint", 4),
        ("probe", 4), ("evaluate", 4), ("final", None), ("test", None),
    ]  # fmt: skip
    assert all(t.seconds >= 0 for t in folder.read_profile())

    # Test: once, at the end, for the base model, the checkpoint chosen on validation and the final one.
    selected = folder.read_result().selected_update
    assert selected == selected_update(folder.read_evals())
    tests = folder.read_tests()
    assert sorted(tests) == sorted({0, selected, 4}) and folder.read_evals().keys() == reports.keys()
    assert all(list(t.benchmarks) == ["arith-test"] and t.suite.num_problems == 12 for t in tests.values())
    # Every file written reads back through its record and writes the same bytes.
    for path in (run / "eval").rglob("*.json"):
        text = path.read_text()
        assert json.dumps(EvalReport.from_dict(json.loads(text)).to_dict(), indent=2) + "\n" == text, path
    again = tmp_path / "again"
    again.mkdir()
    folder.read_result().write(again)
    folder.read_settings().write(again)
    assert (again / "result.json").read_text() == folder.result_file.read_text()
    assert (again / "config.json").read_text() == folder.config_file.read_text()

    # A fresh engine loads the final model (update 4's weights, as training saves every model) and scores
    # both splits at once: each prompt's sampling seed depends on the seed and its id alone.
    out = tmp_path / "fresh.json"
    done = ggpo(
        "eval", "--model", str(result.final_model), "--pool", str(vllm_pool), "-n", "4",
        "-k", "1,2,4", "--dataset", "arith:validation", "--dataset", "arith:test", "--num-problems", "12",
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    fresh = json.loads(out.read_text())
    assert fresh["benchmarks"]["arith-validation"] == reports[4]["benchmarks"]["arith-validation"]
    assert fresh["benchmarks"]["arith-test"] == tests[4].benchmarks["arith-test"].to_dict()
    assert fresh["benchmarks"]["arith-validation"] != reports[0]["benchmarks"]["arith-validation"]
    assert fresh["settings"]["dtype"] == reports[4]["settings"]["dtype"] == "float32"
    # The borrowed session engine got the embedded model's weights back.
    base = evaluate(eval_config(config, tiny_dir), engine=vllm_engine)
    assert (
        base.benchmarks["arith-validation"].counts == reports[0]["benchmarks"]["arith-validation"]["counts"]
    )


# A result.json as `Run.finish` writes it (a real one's keys, order and values).
WRITTEN_RESULT = """{
  "run_id": "f741c37c4f634b2686d317e9dfc53b64",
  "tracking_uri": "sqlite:////tmp/fresh/mlruns.db",
  "pool_fingerprint": "6ecaa66fc30ea53f218e8fbaac6c05fbd5cfc594aa6bccaa133a3c2f23cb6d9d",
  "data_order_fingerprint": "1a88c4f67bbfb3b60e843006cfbf0024a46a88c2d6b672093d24a1ffd7db53f2",
  "updates": 20,
  "final_model": "reports/base/runs/agro-s1234/final",
  "selected_update": 10
}
"""


def test_result_json_reads_back_typed_writes_the_same_bytes_and_tolerates_missing_keys():
    from ggpo_offline.train.run_inputs import Fingerprints
    from ggpo_offline.train.run_records import RunResult

    result = RunResult.from_dict(json.loads(WRITTEN_RESULT))
    assert json.dumps(result.to_dict(), indent=2) + "\n" == WRITTEN_RESULT
    assert (result.updates, result.selected_update, result.tracking_uri) == (
        20,
        10,
        "sqlite:////tmp/fresh/mlruns.db",
    )
    partial = RunResult.from_dict({"selected_update": 5, "pool_fingerprint": "p"})  # older or hand-written
    assert (partial.selected_update, partial.pool_fingerprint, partial.run_id, partial.updates) == (
        5,
        "p",
        None,
        None,
    )
    # config.json and result.json store the fingerprints under these keys, in this order.
    stored = Fingerprints(result.pool_fingerprint, result.data_order_fingerprint).to_dict()
    assert json.dumps(stored) == json.dumps(
        {"pool_fingerprint": result.pool_fingerprint, "data_order_fingerprint": result.data_order_fingerprint}
    )


def test_checkpoint_selection_reads_validation_only_and_prefers_the_earliest_best():
    from ggpo_offline.evaluate.benchmark_scores import Scores
    from ggpo_offline.evaluate.eval_report import EvalReport
    from ggpo_offline.train.evaluation import selected_update

    def report(mean: float) -> EvalReport:
        return EvalReport(4, (1,), {}, Scores(10, mean, {1: mean}), settings=eval_settings(), run={})

    assert selected_update({0: report(0.3), 5: report(0.5), 10: report(0.5), 15: report(0.4)}) == 5
    assert selected_update({0: report(0.6), 5: report(0.5)}) == 0
    assert selected_update({20: report(0.1), 10: report(0.2)}) == 10


def test_in_training_evaluation_refuses_the_test_split():
    with pytest.raises(UserError, match="--eval-dataset arith:test: the in-training evaluation selects"):
        resolve_config("tiny", None, eval_datasets=("arith:test",))
    with pytest.raises(UserError, match="--eval-dataset m.jsonl: the in-training evaluation"):
        resolve_config("tiny", None, eval_datasets=("m.jsonl",), test_datasets=("m.jsonl",))
    allowed = resolve_config("tiny", None, eval_datasets=("arith:test",), allow_test_eval=True)
    assert allowed.evaluation.eval_datasets == ("arith:test",)
    assert resolve_config("tiny").evaluation.eval_datasets == ("arith:validation",)
    assert resolve_config("tiny").evaluation.test_datasets == ("arith:test",)
    with pytest.raises(UserError, match="a --test-dataset is given twice"):
        resolve_config(None, None, test_datasets=("arith:test", "arith:test"))


def _logprobs_under(model_dir, batch) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return response_logprobs(model, batch)[0]


def test_pi0_cache_serves_the_initial_models_logprobs_and_is_keyed(vllm_pool, tiny_dir, tmp_path):
    import shutil

    from ggpo_offline.train.pi0_cache import Pi0Cache, cache_key, numerics, score_pool
    from ggpo_offline.train.pool_index import check_pool

    path = tmp_path / "pool.parquet"
    shutil.copy(vllm_pool, path)
    pool = check_pool(path)
    device = torch.device("cpu")
    cache = score_pool(pool, tiny_dir, device, 1.0)  # the pool's sampling temperature
    assert cache.path.parent == tmp_path and cache.path.name.startswith("pool.pi0-")
    stamp = cache.path.stat().st_mtime_ns
    again = score_pool(pool, tiny_dir, device, 1.0)
    assert again.path == cache.path and cache.path.stat().st_mtime_ns == stamp
    index = pool.index
    batch = MinibatchReader(path, index, pad_id=0).read(index.mixed_group_ids[[4, 1, 7]].tolist())
    # float32 sums in other batch shapes (packed vs one padded batch): measured up to 1.6e-5 on a log-prob of
    # -3.2, so a relative term beside the absolute one.
    torch.testing.assert_close(cache.logprobs(batch), _logprobs_under(tiny_dir, batch), atol=1e-5, rtol=1e-5)
    key = cache_key(pool, tiny_dir, device, 1.0, sharded=False)
    assert (key["temperature"], key["numerics"]) == (1.0, "fp32 (cpu), packed")
    with pytest.raises(UserError, match="is not the π0 cache of this pool and model"):
        Pi0Cache(cache.path, {**key, "weights_sha256": "0" * 64})
    # FSDP2 computes in bf16 on CUDA (not on CPU): such a learner's π0 has its own cache there.
    assert score_pool(pool, tiny_dir, device, 1.0, sharded=True).path == cache.path
    assert numerics(torch.device("cuda"), sharded=True) != numerics(torch.device("cuda"), sharded=False)
    padded = score_pool(pool, tiny_dir, device, 1.0, packed=False)  # --no-packing: other numerics, rescored
    assert padded.path == cache.path and padded.path.stat().st_mtime_ns != stamp
    torch.testing.assert_close(padded.logprobs(batch), cache.logprobs(batch), atol=1e-5, rtol=1e-5)
    with pytest.raises(UserError, match="is not the π0 cache of this pool and model"):
        Pi0Cache(cache.path, key)  # the packed key no longer matches the file


def test_scheduled_anchor_passes_equal_what_frozen_copies_would_compute(vllm_pool, tiny_dir, tmp_path):
    """The reference after a refresh is the checkpointed weights of that update, before it π0; π_old is
    the weights at its TIS block start. Recompute each from the checkpoints and compare the logged metrics."""
    from ggpo_offline.train import diagnostics as diag

    ggpo = train(_config(vllm_pool, tmp_path, ref_refresh=2, save_every=1, out=tmp_path / "g", lr=1e-3))
    tis = train(
        _config(vllm_pool, tmp_path, method="grpo-tis", tis_block=2, save_every=1, out=tmp_path / "t")
    )
    index = index_pool(vllm_pool)
    plan = plan_minibatches(index, 42, 4, 2)
    reader = MinibatchReader(vllm_pool, index, pad_id=0)
    weights = {u: (tmp_path / "g" / "checkpoints" / f"update-{u:06d}") for u in (1, 2, 3)}
    for update, ref_dir in ((1, tiny_dir), (3, weights[2])):
        batch = reader.read(plan[update].tolist())
        logp, ref = _logprobs_under(weights[update], batch), _logprobs_under(ref_dir, batch)
        expected = diag.ref_log_ratio(logp, ref, batch.mask, response_count=batch.num_responses).item()
        assert ggpo.metrics[update]["ref/log_ratio"] == pytest.approx(expected, abs=1e-5)
    assert abs(ggpo.metrics[3]["ref/log_ratio"]) > 1e-4  # the refresh moved the reference away from π0
    batch = reader.read(plan[3].tolist())
    old = _logprobs_under(tmp_path / "t" / "checkpoints" / "update-000002", batch)
    weight = torch.exp(old - batch.behavior_logp).clamp(max=2.0)
    expected = ((weight * batch.mask).sum() / batch.mask.sum()).item()
    assert tis.metrics[3]["grpo-tis/tis_weight_mean"] == pytest.approx(expected, abs=1e-5)
