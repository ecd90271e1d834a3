"""Padding-free decoder forwards: a micro-batch's rows packed into one sequence, attention per document.

The rows' real tokens are concatenated into one sequence of N positions, with position ids restarting at 0
for each row (so rotary embeddings see what they see padded) and the document boundaries passed to the
attention as ``cu_seq_lens_q/k`` (transformers' varlen keywords). The projections and MLPs then run on
exactly the N real positions, and the attention of each document is one causal SDPA call: no compute goes
to padding or across documents.

The attention is transformers' own interface: a function registered as ``DOCUMENT_ATTENTION`` that runs
SDPA document by document when boundaries are given and is transformers' SDPA otherwise (padded forwards,
generation), so switching a model to it changes nothing else. A flash-attention build's varlen kernel reads
the same keywords, so a model loaded with ``flash_attention_2/3`` packs natively. Not flex_attention: in
torch 2.13 it has no backward on the CPU ("FlexAttention does not support backward on CPU"), and one path
must serve the CPU testbed and the GPUs alike. Models with sliding-window layers or another attention keep
the length-sorted padded forwards (`packing_supported`).
"""

import torch
import torch.nn.functional as F

DOCUMENT_ATTENTION = "ggpo_documents"
NATIVE_VARLEN = ("flash_attention_2", "flash_attention_3")


def document_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Causal SDPA within each document ``cu_seq_lens_q[i]:cu_seq_lens_q[i+1]`` of a packed (1, N)
    sequence; without boundaries, transformers' SDPA. Output (1, N, heads, head_dim), as SDPA's."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    bounds = kwargs.get("cu_seq_lens_q")
    if bounds is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    # split, not slices: its backward is one concatenation, where each slice's would fill a full-size zero
    # gradient (quadratic in the number of documents). enable_gqa: the key/value heads are shared in the
    # kernel, not copied (allowed without a mask on CPU and CUDA).
    sizes = bounds.diff().tolist()
    outputs = [
        F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, scale=scaling, is_causal=True, enable_gqa=True
        )
        for q, k, v in zip(*(x.split(sizes, dim=2) for x in (query, key, value)), strict=True)
    ]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def _document_mask(*args, attention_mask: torch.Tensor | None = None, **kwargs):
    """No mask for a packed forward (the boundaries travel as keywords); SDPA's mask for a padded one."""
    from transformers.masking_utils import sdpa_mask

    return None if attention_mask is None else sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(DOCUMENT_ATTENTION, document_attention)
    AttentionMaskInterface.register(DOCUMENT_ATTENTION, _document_mask)


def packing_supported(model: torch.nn.Module) -> bool:
    """Whether ``model`` can run packed forwards; switches an SDPA model to `document_attention` (the same
    numbers for every other call). False for sliding-window layers and attentions other than SDPA and
    flash-attention's varlen kernels: those keep padded forwards."""
    config = model.config
    implementation = config._attn_implementation
    sliding = getattr(config, "use_sliding_window", False) or "sliding_attention" in (
        getattr(config, "layer_types", None) or ()
    )
    if sliding or implementation not in ("sdpa", DOCUMENT_ATTENTION, *NATIVE_VARLEN):
        return False
    if implementation == "sdpa":
        _register()
        model.set_attn_implementation(DOCUMENT_ATTENTION)
    return True


def packed_hidden_states(
    decoder: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoder's last hidden states of right-padded rows run as one packed sequence: ``(N, H)`` for
    the N real positions in row order, and each row's first index in it, ``(rows,)``."""
    lengths = attention_mask.sum(dim=1)
    real = attention_mask.bool()
    bounds = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(device, torch.int32)
    longest = int(lengths.max())
    hidden = decoder(
        input_ids=input_ids[real][None].to(device),
        position_ids=(attention_mask.cumsum(dim=1) - 1)[real][None].to(device),
        cu_seq_lens_q=bounds,
        cu_seq_lens_k=bounds,
        max_length_q=longest,
        max_length_k=longest,
    ).last_hidden_state
    return hidden[0], bounds[:-1].long()
