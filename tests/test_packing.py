"""Padding-free packed forwards: the same values and gradients as padded ones, and a fallback where the
attention cannot be packed."""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ggpo_offline.train.logprobs import length_buckets, response_logprobs
from ggpo_offline.train.losses import ggpo_loss
from ggpo_offline.train.minibatch import Minibatch
from ggpo_offline.train.packing import DOCUMENT_ATTENTION, packing_supported


def _model(**changes) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=300, max_position_embeddings=512)  # fmt: skip
    return Qwen3ForCausalLM(Qwen3Config(**{**shape, **changes}))


def _batch(lengths: list[tuple[int, int]], m: int = 2, seed: int = 0) -> Minibatch:
    """Rows of (prompt, response) lengths, right-padded, as the pool reader lays them out."""
    gen = torch.Generator().manual_seed(seed)
    B, L, T = len(lengths), max(p + r for p, r in lengths), max(r for _, r in lengths)
    input_ids = torch.zeros(B, L, dtype=torch.long)
    attention_mask = torch.zeros(B, L, dtype=torch.long)
    response_ids = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T)
    for i, (p, r) in enumerate(lengths):
        input_ids[i, : p + r] = torch.randint(3, 300, (p + r,), generator=gen)
        attention_mask[i, : p + r] = 1
        response_ids[i, :r] = input_ids[i, p : p + r]
        mask[i, :r] = 1
    return Minibatch(
        input_ids, attention_mask, torch.tensor([p for p, _ in lengths]), response_ids, mask,
        -torch.rand(B, T, generator=gen) * mask, torch.tensor([1.0, 0.0] * (B // 2)),
        torch.zeros(B, dtype=torch.bool), list(range(B // m)), m,
    )  # fmt: skip


LENGTHS = [(7, 30), (12, 3), (5, 61), (9, 1), (7, 18), (11, 44)]
_TENSORS = ("input_ids", "attention_mask", "prompt_lengths", "response_ids", "mask", "behavior_logp",
            "rewards", "truncated")  # fmt: skip


def _run(model, batch, **options):
    model.zero_grad(set_to_none=True)
    logp, entropy = response_logprobs(model, batch, with_entropy=True, **options)
    ref = batch.behavior_logp + 0.1 * batch.mask
    out = ggpo_loss(logp, ref, batch.mask, batch.rewards, group_size=batch.group_size, beta=0.05)
    out.loss.backward()
    return logp.detach(), entropy, out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("forward_tokens", [10**6, 100, 1])
def test_packed_forwards_equal_padded_ones_in_values_and_gradients(forward_tokens):
    """GQA model, rows of very different lengths (1 to 61 response tokens); one packed forward, several
    (a 100-position budget) or one per row, against padded length-sorted forwards, fp32."""
    model, batch = _model(), _batch(LENGTHS)
    padded = _run(model, batch, packed=False, forward_tokens=forward_tokens)
    packed = _run(model, batch, packed=True, forward_tokens=forward_tokens)
    assert model.config._attn_implementation == DOCUMENT_ATTENTION
    torch.testing.assert_close(packed[0], padded[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[1], padded[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[2], padded[2], atol=1e-6, rtol=1e-5)
    assert padded[3].keys() == packed[3].keys()
    for name, grad in padded[3].items():
        torch.testing.assert_close(packed[3][name], grad, atol=1e-5, rtol=1e-5, msg=name)
    assert torch.all(packed[0][batch.mask == 0] == 0)


def test_a_packed_row_sees_only_its_own_document():
    """Each row's log-probs are those of a forward over that row alone: nothing leaks between documents."""
    model, batch = _model(), _batch(LENGTHS)
    with torch.no_grad():
        together = response_logprobs(model, batch, packed=True)[0]
        for i in range(batch.num_responses):
            row = Minibatch(*(getattr(batch, f)[i : i + 1] for f in _TENSORS), [0], 1)
            alone = response_logprobs(model, row, packed=True)[0]
            torch.testing.assert_close(together[i : i + 1, : alone.shape[1]], alone, atol=1e-5, rtol=0)


def test_switching_to_document_attention_leaves_padded_forwards_and_generation_unchanged():
    """Left-padded rows (as in generation) need the padding mask: the switched model still builds it."""
    model, batch = _model(), _batch(LENGTHS)
    ids, mask = batch.input_ids.flip(1), batch.attention_mask.flip(1)  # left-padded
    prompt = batch.input_ids[:1, :7]
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask).logits
        generated = model.generate(prompt, max_new_tokens=6, do_sample=False)
        assert packing_supported(model)
        after = model(input_ids=ids, attention_mask=mask).logits
        assert torch.equal(after[mask.bool()], before[mask.bool()])
        assert torch.equal(model.generate(prompt, max_new_tokens=6, do_sample=False), generated)


@pytest.mark.parametrize(
    "changes",
    [
        {"attn_implementation": "eager"},
        {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0},
    ],
    ids=["eager attention", "sliding-window layers"],
)
def test_attention_that_cannot_be_packed_keeps_padded_forwards(changes):
    model, batch = _model(**changes), _batch(LENGTHS)
    assert not packing_supported(model)
    implementation = model.config._attn_implementation
    with torch.no_grad():
        default = response_logprobs(model, batch)[0]
        padded = response_logprobs(model, batch, packed=False)[0]
    assert torch.equal(default, padded) and model.config._attn_implementation == implementation


def test_packed_buckets_count_real_positions_not_padded_ones():
    lengths = [5, 40, 12, 40, 7, 100, 12]
    # 100 alone (over budget); 40 + 12 <= 60 real positions, but 2 rows x 40 > 60 padded ones
    assert length_buckets(lengths, forward_tokens=60, packed=True) == [[5], [1], [3, 2], [6, 4, 0]]
    assert length_buckets(lengths, forward_tokens=60) == [[5], [1], [3], [2, 6, 4, 0]]
    assert length_buckets(lengths, forward_tokens=None, packed=True) == [[5, 1, 3, 2, 6, 4, 0]]
