"""Token log-probs (and entropy) of stored responses under a model, with trainer numerics."""

from contextlib import nullcontext

import torch

from ggpo_offline.diagnostics import token_entropy
from ggpo_offline.train.batch import Minibatch


def autocast_for(device: torch.device):
    """bf16 autocast on CUDA (fp32 master weights); plain fp32 on CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def response_logprobs(
    model: torch.nn.Module, batch: Minibatch, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log π(a_t | x, a_<t)`` for every response token, ``(B, T)``; padding positions hold 0.

    The model sees prompt + response (right-padded, so default position ids are correct); the logits
    at position p predict the token at p + 1.
    """
    device = next(model.parameters()).device
    with autocast_for(device):
        logits = model(
            input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device)
        ).logits  # (B, L, V)
    T = batch.response_ids.shape[1]
    positions = batch.prompt_lengths.to(device)[:, None] - 1 + torch.arange(T, device=device)  # (B, T)
    positions = positions.clamp(max=logits.shape[1] - 1)
    picked = logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1])).float()  # (B, T, V)
    log_probs = torch.log_softmax(picked, dim=-1)
    mask = batch.mask.to(device)
    logp = log_probs.gather(-1, batch.response_ids.to(device)[..., None])[..., 0] * mask
    entropy = token_entropy(picked) * mask if with_entropy else None
    return logp, entropy
