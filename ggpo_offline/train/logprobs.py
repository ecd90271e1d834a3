"""Token log-probs (and entropy) of stored responses under a model, with trainer numerics."""

from contextlib import nullcontext

import torch

from ggpo_offline.diagnostics import token_entropy
from ggpo_offline.train.batch import Minibatch

CHUNK_TOKENS = 512
"""Response tokens per log-softmax chunk: the fp32 logits held at once are (CHUNK_TOKENS, V), whatever the
batch size; the backward pass recomputes each chunk's logits instead of keeping them."""
# Configs whose forward rescales or caps the logits after the head; the chunked path would skip that.
LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def default_device() -> torch.device:
    """The learner's device: the GPU when there is one."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


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


def response_logprobs(
    model: torch.nn.Module,
    batch: Minibatch,
    with_entropy: bool = False,
    chunk_tokens: int = CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log π(a_t | x, a_<t)`` for every response token, ``(B, T)``; padding positions hold 0.

    The decoder runs once over prompt + response; the output head and the fp32 log-softmax then run only
    on the valid response tokens, ``chunk_tokens`` at a time (`TokenLogprobs`), gathering the sampled
    token's log-prob and, when asked, the full-vocabulary entropy. Peak memory no longer grows with
    ``B·T·V``; values and gradients equal ``full_vocab_logprobs`` (tested to 1e-5 in fp32).
    """
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None or any(
        getattr(model.config, key, None) for key in LOGIT_POSTPROCESSING
    ):
        return full_vocab_logprobs(model, batch, with_entropy)
    device = next(model.parameters()).device
    with autocast_for(device):
        hidden = model.get_decoder()(
            input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device)
        ).last_hidden_state  # (B, L, H)
    rows, cols = batch.mask.to(device).nonzero(as_tuple=True)  # valid response tokens, row-major
    positions = _response_positions(batch, hidden.shape[1], device)[rows, cols]
    targets = batch.response_ids.to(device)[rows, cols]
    logp_flat, entropy_flat = TokenLogprobs.apply(
        hidden[rows, positions], head.weight, targets, with_entropy, chunk_tokens
    )
    shape = batch.response_ids.shape
    logp = torch.zeros(shape, device=device).index_put((rows, cols), logp_flat)
    if not with_entropy:
        return logp, None
    return logp, torch.zeros(shape, device=device).index_put((rows, cols), entropy_flat)


class TokenLogprobs(torch.autograd.Function):
    """``log softmax(h W^T)[target]`` (and the entropy) per token, chunk by chunk, never keeping logits.

    forward: per chunk, logits → fp32 logsumexp ``z`` → ``logp = logit[target] − z``; the entropy
    (``diagnostics.token_entropy``) is a detached diagnostic. backward recomputes each chunk's logits and uses
    ``∂logp/∂logits = onehot(target) − softmax``, so only ``h``, ``W``, targets and ``z`` are saved.
    """

    @staticmethod
    def forward(ctx, states, weight, targets, with_entropy: bool, chunk_tokens: int):
        logps, entropies, normalizers = [], [], []
        for start in range(0, states.shape[0], chunk_tokens):
            logits = _logits(states[start : start + chunk_tokens], weight)
            normalizer = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(-1, targets[start : start + chunk_tokens, None])[:, 0]
            logps.append(picked - normalizer)
            normalizers.append(normalizer)
            if with_entropy:
                entropies.append(token_entropy(logits))
        ctx.save_for_backward(states, weight, targets, torch.cat(normalizers))
        ctx.chunk_tokens = chunk_tokens
        ctx.mark_non_differentiable(*([torch.cat(entropies)] if with_entropy else []))
        return torch.cat(logps), torch.cat(entropies) if with_entropy else None

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        states, weight, targets, normalizers = ctx.saved_tensors
        grad_states = torch.empty_like(states)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        for start in range(0, states.shape[0], ctx.chunk_tokens):
            chunk = slice(start, start + ctx.chunk_tokens)
            logits = _logits(states[chunk], weight)
            grad_logits = -torch.exp(logits - normalizers[chunk, None]) * grad_logp[chunk, None]
            grad_logits.scatter_add_(-1, targets[chunk, None], grad_logp[chunk, None])
            grad_logits = grad_logits.to(states.dtype)
            grad_states[chunk] = grad_logits @ weight.to(states.dtype)
            grad_weight += (grad_logits.T @ states[chunk]).float()
        return grad_states, grad_weight.to(weight.dtype), None, None, None


def _logits(states: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """fp32 logits of a chunk; the matmul runs in the hidden states' dtype (bf16 under CUDA autocast)."""
    return (states @ weight.to(states.dtype).T).float()


def full_vocab_logprobs(
    model: torch.nn.Module, batch: Minibatch, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The straightforward computation: full logits, then an fp32 log-softmax over ``(B, T, V)``.

    The reference that ``response_logprobs`` is tested and benchmarked against.
    """
    device = next(model.parameters()).device
    with autocast_for(device):
        logits = model(
            input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device)
        ).logits  # (B, L, V)
    positions = _response_positions(batch, logits.shape[1], device)
    picked = logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1])).float()  # (B, T, V)
    log_probs = torch.log_softmax(picked, dim=-1)
    mask = batch.mask.to(device)
    logp = log_probs.gather(-1, batch.response_ids.to(device)[..., None])[..., 0] * mask
    entropy = token_entropy(picked) * mask if with_entropy else None
    return logp, entropy
