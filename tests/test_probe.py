"""The drift from π0 that every evaluated checkpoint logs: equal to a plain transformers computation on the
probe, 0 at update 0, kept across a resume, and invisible to training itself."""

import json
from dataclasses import replace

import pytest
import torch
from test_train import _config, _metrics

from ggpo_offline.evaluate.evaluator import Evaluator
from ggpo_offline.train.evaluation import eval_config
from ggpo_offline.train.metric_names import GENERATED_METRICS, PROBE_K3, PROBE_LOG_RATIO
from ggpo_offline.train.pool_index import index_pool
from ggpo_offline.train.trainer import train

pytestmark = pytest.mark.vllm


def _train(config, vllm_engine, tiny_dir, **kwargs):
    with Evaluator(eval_config(config, tiny_dir), engine=vllm_engine) as evaluator:
        return train(config, evaluator=evaluator, **kwargs)


@torch.no_grad()
def _sequence_logprobs(model_dir, rows) -> list[torch.Tensor]:
    """Each response's token log-probs under the model in ``model_dir``: one unpacked forward per row."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    found = []
    for row in rows:
        prompt, response = row["prompt_token_ids"], row["response_token_ids"]
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
        found.append(torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(response)[:, None])[:, 0])
    return found


def _probe_rows(pool, groups: int) -> list[dict]:
    import pyarrow.parquet as pq

    probe = set(index_pool(pool).mixed_group_ids[:groups].tolist())
    return [row for row in pq.read_table(pool).to_pylist() if row["group_id"] in probe]


def test_the_probe_drift_is_k3_and_the_log_ratio_to_pi0_by_hand(vllm_pool, vllm_engine, tiny_dir, tmp_path):
    config = _config(vllm_pool, tmp_path, eval_every=2, eval_n=2, eval_num_problems=8, lr=2e-3,
                     probe_groups=6, micro_batch_size=8, no_test=True)  # fmt: skip
    result = _train(config, vllm_engine, tiny_dir)
    logged = {row["update"]: row for row in _metrics(result.run_dir) if PROBE_K3 in row}
    assert sorted(logged) == [0, 2, 4]
    assert logged[0][PROBE_K3] == 0.0 and logged[0][PROBE_LOG_RATIO] == 0.0  # π0 against itself, exactly
    rows = _probe_rows(vllm_pool, 6)
    pi0 = _sequence_logprobs(tiny_dir, rows)
    tokens = sum(len(r["response_token_ids"]) for r in rows)
    for update in (2, 4):
        policy = _sequence_logprobs(result.run_dir / "checkpoints" / f"update-{update:06d}", rows)
        ratios = [p - q for p, q in zip(policy, pi0, strict=True)]
        k3 = sum(float((torch.expm1(r) - r).sum()) for r in ratios) / tokens
        log_ratio = sum(float(r.sum()) for r in ratios) / len(rows)
        assert logged[update][PROBE_K3] == pytest.approx(k3, rel=1e-3) and k3 > 1e-4
        assert logged[update][PROBE_LOG_RATIO] == pytest.approx(log_ratio, rel=1e-3, abs=1e-4)
    assert logged[4][PROBE_K3] > logged[2][PROBE_K3]  # a learning rate this large keeps moving away
    # what the policy generated is logged beside, at every evaluated checkpoint
    assert all(name in logged[u] for name in GENERATED_METRICS for u in (0, 2, 4))


def test_the_probe_leaves_training_alone_and_survives_a_resume(vllm_pool, vllm_engine, tiny_dir, tmp_path):
    config = _config(vllm_pool, tmp_path, method="ggpo", eval_every=2, eval_n=2, eval_num_problems=8,
                     lr=2e-3, save_every=2, no_test=True)  # fmt: skip
    full = _train(replace(config, out=tmp_path / "full"), vllm_engine, tiny_dir)
    off = _train(replace(config, out=tmp_path / "off", probe_groups=0), vllm_engine, tiny_dir)
    without = [{k: v for k, v in row.items() if not k.startswith("probe/")} for row in _metrics(full.run_dir)]
    assert without == _metrics(off.run_dir)  # the same training, update for update
    assert not any(k.startswith("probe/") for row in _metrics(off.run_dir) for k in row)

    def crash(update, metrics):
        if update == 2:  # after the checkpoint of update 2 was written
            raise KeyboardInterrupt

    cut = replace(config, out=tmp_path / "cut")
    with pytest.raises(KeyboardInterrupt):
        _train(cut, vllm_engine, tiny_dir, on_update=crash)
    resumed = _train(cut, vllm_engine, tiny_dir, resume=True)
    assert _metrics(resumed.run_dir) == _metrics(full.run_dir)  # π0's probe log-probs came in the checkpoint
    assert json.loads((resumed.run_dir / "metrics.jsonl").read_text().splitlines()[-1])[PROBE_K3] > 0
