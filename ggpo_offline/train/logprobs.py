"""Token log-probs (and entropy) of stored responses under a model, with trainer numerics."""

from contextlib import nullcontext

import torch

from ggpo_offline.core.errors import UserError
from ggpo_offline.train.config import FORWARD_TOKENS
from ggpo_offline.train.diagnostics import token_entropy
from ggpo_offline.train.minibatch import Minibatch
from ggpo_offline.train.packing import packed_hidden_states, packing_supported

CHUNK_LOGITS = 2**25
"""fp32 logits held at once by the head/log-softmax (128 MB): a chunk is CHUNK_LOGITS // V response tokens,
so peak memory stays flat as the vocabulary grows; the backward pass recomputes each chunk, never keeps it."""
# Configs whose forward rescales or caps the logits after the head; the chunked path would skip that.
LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def autocast_for(device: torch.device):
    """bf16 autocast on CUDA (fp32 master weights); plain fp32 on CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def _response_positions(batch: Minibatch, length: int, device: torch.device) -> torch.Tensor:
    """(B, T) index of the position whose logits predict response token t (prompt length − 1 + t)."""
    T = batch.response_ids.shape[1]
    positions = batch.prompt_lengths.to(device)[:, None] - 1 + torch.arange(T, device=device)
    return positions.clamp(max=length - 1)


def length_buckets(lengths: list[int], forward_tokens: int | None, packed: bool = False) -> list[list[int]]:
    """Row indices, longest first, cut into runs whose size fits ``forward_tokens``: rows × their longest
    when padded, the sum of their lengths when ``packed``; a row longer than that gets a forward of its
    own. None: one forward for all."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    if forward_tokens is None:
        return [order]
    buckets: list[list[int]] = []
    for i in order:
        bucket = buckets[-1] if buckets else None
        if bucket and _forward_size([lengths[j] for j in bucket] + [lengths[i]], packed) <= forward_tokens:
            bucket.append(i)
        else:
            buckets.append([i])
    return buckets


def _forward_size(lengths: list[int], packed: bool) -> int:
    """Positions a forward over rows of these lengths (longest first) computes."""
    return sum(lengths) if packed else len(lengths) * lengths[0]


def response_logprobs(
    model: torch.nn.Module,
    batch: Minibatch,
    with_entropy: bool = False,
    chunk_tokens: int | None = None,
    forward_tokens: int | None = FORWARD_TOKENS,
    temperature: float = 1.0,
    packed: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log π(a_t | x, a_<t)`` for every response token, ``(B, T)``; padding positions hold 0.

    π is the model's distribution at the pool's sampling ``temperature``: softmax(logits / T), the
    distribution the engine sampled from and stored log-probs of (the entropy is that distribution's too).

    The decoder runs over prompt + response in forwards of at most ``forward_tokens`` positions
    (`length_buckets`): ``packed`` (where `packing_supported`), the rows of a forward are one padding-free
    sequence with per-document attention (`packing`); otherwise each forward is cut to its own longest
    row, rows length-sorted, so little compute goes to padding. The output head and the fp32 log-softmax run
    only on the valid response tokens, ``chunk_tokens`` at a time (default ``CHUNK_LOGITS // V``;
    `TokenLogprobs`), gathering the sampled token's log-prob and, when asked, the full-vocabulary entropy.
    Peak memory does not grow with ``B·T·V``; values and gradients equal ``full_vocab_logprobs``
    (tested to 1e-5 in fp32).
    """
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None or any(
        getattr(model.config, key, None) for key in LOGIT_POSTPROCESSING
    ):
        return full_vocab_logprobs(model, batch, with_entropy, temperature)
    _check_vocabulary(model, batch)
    device = next(model.parameters()).device
    states, index = _response_token_states(model, batch, forward_tokens, packed and packing_supported(model))
    chunk_tokens = chunk_tokens or max(1, CHUNK_LOGITS // head.weight.shape[0])
    logp_flat, entropy_flat = TokenLogprobs.apply(
        states,
        head.weight,
        batch.response_ids.to(device)[index],
        with_entropy,
        chunk_tokens,
        temperature,
    )
    shape = batch.response_ids.shape
    logp = torch.zeros(shape, device=device).index_put(index, logp_flat)
    if not with_entropy:
        return logp, None
    return logp, torch.zeros(shape, device=device).index_put(index, entropy_flat)


def _response_token_states(
    model: torch.nn.Module, batch: Minibatch, forward_tokens: int | None, packed: bool
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The decoder's last hidden state at the position predicting each valid response token, (N, H), and
    those tokens' (row, column) in ``batch.response_ids``; forwards of at most ``forward_tokens``
    positions."""
    device = next(model.parameters()).device
    lengths = batch.attention_mask.sum(dim=1)
    states, token_rows, token_cols = [], [], []
    for bucket in length_buckets(lengths.tolist(), forward_tokens, packed):
        rows, width = torch.tensor(bucket), int(lengths[bucket[0]])
        r, c = batch.mask[rows].nonzero(as_tuple=True)  # valid response tokens of these rows
        positions = batch.prompt_lengths[rows][r] - 1 + c  # of each token's predicting logits, in its row
        with autocast_for(device):
            if packed:
                hidden, starts = packed_hidden_states(
                    model.get_decoder(), batch.input_ids[rows, :width], batch.attention_mask[rows, :width],
                    device,
                )  # fmt: skip
                states.append(hidden[starts[r.to(device)] + positions.to(device)])
            else:
                hidden = model.get_decoder()(
                    input_ids=batch.input_ids[rows, :width].to(device),
                    attention_mask=batch.attention_mask[rows, :width].to(device),
                ).last_hidden_state  # (rows, width, H)
                states.append(hidden[r.to(device), positions.to(device)])
        token_rows.append(rows[r])
        token_cols.append(c)
    index = (torch.cat(token_rows).to(device), torch.cat(token_cols).to(device))
    return torch.cat(states), index


def _check_vocabulary(model: torch.nn.Module, batch: Minibatch) -> None:
    """A token id without an embedding row would crash deep in the model (on a GPU, asynchronously)."""
    vocabulary = model.get_input_embeddings().num_embeddings
    largest = int(batch.input_ids.max())
    if largest >= vocabulary:
        row = int((batch.input_ids >= vocabulary).any(dim=1).nonzero()[0])
        raise UserError(
            f"group {batch.group_ids[row // batch.group_size]} holds token id {largest}, outside the model's "
            f"vocabulary of {vocabulary}; the pool was not made with this model's tokenizer"
        )


class ResponseLogprobs(torch.nn.Module):
    """A causal LM whose forward is `response_logprobs`: one module call per micro-batch, so DDP's and
    FSDP2's hooks (gradient reduction, parameter gathering) see every use of the weights, head included."""

    def __init__(self, model: torch.nn.Module, temperature: float = 1.0, packed: bool = True):
        super().__init__()
        self.model = model
        self.temperature = temperature
        self.packed = packed

    def forward(
        self, batch: Minibatch, with_entropy: bool = False, forward_tokens: int | None = FORWARD_TOKENS
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return response_logprobs(
            self.model, batch, with_entropy, forward_tokens=forward_tokens, temperature=self.temperature,
            packed=self.packed,
        )  # fmt: skip


class TokenLogprobs(torch.autograd.Function):
    """``log softmax(h W^T / τ)[target]`` (and the entropy) per token, chunk by chunk, never keeping logits.

    forward: per chunk, logits ``l = h W^T / τ`` (τ the sampling temperature) → fp32 log-normalizer
    ``z = logsumexp(l)`` → ``logp = l[target] − z``; the entropy (a detached diagnostic) reuses the same
    exponentials: ``H = −Σ p log p = z − Σ p·l``, equal to ``diagnostics.token_entropy``. backward
    recomputes each chunk's logits and uses ``∂logp/∂l = onehot(target) − softmax`` (times 1/τ for the raw
    logits), in place, so only ``h``, ``W``, targets and ``z`` are saved.
    """

    @staticmethod
    def forward(
        ctx, states, weight, targets, with_entropy: bool, chunk_tokens: int, temperature: float = 1.0
    ):
        logps, entropies, normalizers = [], [], []
        for start in range(0, states.shape[0], chunk_tokens):
            logits = _logits(states[start : start + chunk_tokens], weight, temperature)
            picked = logits.gather(-1, targets[start : start + chunk_tokens, None])[:, 0]
            if with_entropy:
                peak = logits.amax(dim=-1, keepdim=True)
                unnormalized = (logits - peak).exp_()  # p · total
                total = unnormalized.sum(dim=-1)
                normalizer = peak[:, 0] + total.log()
                entropies.append(normalizer - torch.linalg.vecdot(unnormalized, logits) / total)
            else:
                normalizer = torch.logsumexp(logits, dim=-1)
            logps.append(picked - normalizer)
            normalizers.append(normalizer)
        ctx.save_for_backward(states, weight, targets, torch.cat(normalizers))
        ctx.chunk_tokens, ctx.temperature = chunk_tokens, temperature
        ctx.mark_non_differentiable(*([torch.cat(entropies)] if with_entropy else []))
        return torch.cat(logps), torch.cat(entropies) if with_entropy else None

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        states, weight, targets, normalizers = ctx.saved_tensors
        w = weight.to(states.dtype)
        grad_states = torch.empty_like(states)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        for start in range(0, states.shape[0], ctx.chunk_tokens):
            chunk = slice(start, start + ctx.chunk_tokens)
            h, g, picked = states[chunk], grad_logp[chunk, None] / ctx.temperature, targets[chunk]
            # ∂logp/∂l = onehot(target) − softmax. The softmax is built in the recomputed logits' memory and
            # g scales the small (tokens, H) operands, never the (tokens, V) one.
            probs = _logits(h, weight, ctx.temperature).sub_(normalizers[chunk, None]).exp_().to(h.dtype)
            grad_states[chunk] = g * (w[picked] - probs @ w)
            scaled = (g * h).to(h.dtype)
            if h.dtype == grad_weight.dtype:
                grad_weight.addmm_(probs.T, scaled, alpha=-1)
            else:  # bf16 matmul under CUDA autocast, fp32 accumulation
                grad_weight -= (probs.T @ scaled).float()
            grad_weight.index_add_(0, picked, scaled.float())
        return grad_states, grad_weight.to(weight.dtype), None, None, None, None


def _logits(states: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 logits of a chunk divided by the temperature (as the engines do); the matmul runs in the hidden
    states' dtype (bf16 under CUDA autocast)."""
    logits = (states @ weight.to(states.dtype).T).float()
    return logits if temperature == 1.0 else logits.div_(temperature)


def full_vocab_logprobs(
    model: torch.nn.Module, batch: Minibatch, with_entropy: bool = False, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The straightforward computation: full logits / temperature, then an fp32 log-softmax (B, T, V).

    The reference that ``response_logprobs`` is tested and benchmarked against.
    """
    device = next(model.parameters()).device
    with autocast_for(device):
        logits = model(
            input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device)
        ).logits  # (B, L, V)
    positions = _response_positions(batch, logits.shape[1], device)
    picked = logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1])).float() / temperature
    log_probs = torch.log_softmax(picked, dim=-1)
    mask = batch.mask.to(device)
    logp = log_probs.gather(-1, batch.response_ids.to(device)[..., None])[..., 0] * mask
    entropy = token_entropy(picked) * mask if with_entropy else None
    return logp, entropy
