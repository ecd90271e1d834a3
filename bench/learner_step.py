"""Benchmarks 1 and 2: learner step (forward + backward + GGPO loss) tokens/s, peak RSS and achieved FLOP/s
as a fraction of this machine's fp32 matmul peak measured in the same run.

Paths: ``full`` is the straightforward one (one padded forward, full-vocabulary fp32 log-softmax,
`full_vocab_logprobs`); ``padded`` adds the chunked head/log-softmax on one padded forward;
``length-sorted`` runs the rows in length-sorted padded forwards of ``FORWARD_TOKENS`` positions;
``packed`` is what training runs (rows packed into padding-free forwards, `train/packing.py`). Each
measurement runs in its own process so that its peak RSS is its own; printed as ratios against ``full``
measured in the same run on the same machine. Tokens/s counts response tokens, never padding; FLOPs count
the work the step needs (`useful_flops`), the same for every path.
"""

import argparse
import functools
import json
import resource
import subprocess
import sys
import time

VOCABS = (32_000, 152_000)
HEAD_PATHS = ("full", "padded", "packed")
LAYOUT_PATHS = ("padded", "length-sorted", "packed")  # `full` cannot run there: see `main`
REALISTIC_STEPS = 1  # after the warm-up; one step is ~50 s on 2 cores


def _batch(vocab: int, groups: int, m: int, prompt: int, lengths: tuple[int, int], seed: int):
    import torch

    from ggpo_offline.train.minibatch import Minibatch

    generator = torch.Generator().manual_seed(seed)
    B = groups * m
    response_lengths = torch.randint(lengths[0], lengths[1] + 1, (B,), generator=generator)
    T = int(response_lengths.max())
    L = prompt + T
    input_ids = torch.randint(3, vocab, (B, L), generator=generator)
    attention_mask = torch.zeros(B, L, dtype=torch.long)
    mask = torch.zeros(B, T)
    for i, n in enumerate(response_lengths.tolist()):
        attention_mask[i, : prompt + n] = 1
        mask[i, :n] = 1
    return Minibatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        prompt_lengths=torch.full((B,), prompt),
        response_ids=input_ids[:, prompt:],
        mask=mask,
        behavior_logp=-torch.rand(B, T, generator=generator) * mask,
        rewards=(torch.rand(B, generator=generator) < 0.5).float(),
        truncated=torch.zeros(B, dtype=torch.bool),
        group_ids=list(range(groups)),
        group_size=m,
    )


SHAPES = {
    # Small decoder, big vocabulary: the output head and log-softmax dominate (benchmark 1).
    "head": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32, groups=1, m=4),
    # Qwen3-shaped and large enough to be compute-bound: 101M decoder parameters, a 152k tied head; the
    # paper's group size (benchmark 2).
    "realistic": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=8, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=64, groups=1, m=8),
}  # fmt: skip
LENGTHS = {"head": (256, 1024), "realistic": (128, 1024)}


def useful_flops(shape: dict, batch) -> float:
    """FLOPs a learner step must do (forward + backward = 3 × forward): 6 · decoder parameters per real
    position, 6 · H · V per response token for the head, and causal attention, 6 · layers · heads ·
    head_dim · Σ n² (QKᵀ and PV, half of each square); padding, prompt logits and the embedding lookup
    are not counted, so a path that computes them shows a lower fraction of peak."""
    H, layers, V = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]
    heads, kv_heads, d = shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"]
    per_layer = H * d * (2 * heads + 2 * kv_heads) + 3 * H * shape["intermediate_size"]
    positions = batch.attention_mask.sum(dim=1)
    decoder = 6 * layers * per_layer * int(positions.sum())
    head = 6 * H * V * int(batch.mask.sum())
    attention = 6 * layers * heads * d * int((positions**2).sum())
    return float(decoder + head + attention)


def matmul_peak(device=None, dtype=None, size: int = 2048, seconds: float = 3.0) -> float:
    """Best matmul FLOP/s of short bursts with torch's default threads, measured in this run."""
    import torch

    device, dtype = device or torch.device("cpu"), dtype or torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        sync(device)
        start = time.perf_counter()
        for _ in range(4):
            torch.mm(a, b)
        sync(device)
        best = max(best, 4 * 2 * size**3 / (time.perf_counter() - start))
    return best


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def random_qwen3(shape: dict, device=None):
    """A random-init Qwen3 of ``shape`` (Qwen3Config keywords) with a tied head, seeded."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(max_position_embeddings=4096, tie_word_embeddings=True, **shape)
    return Qwen3ForCausalLM(config).to(device or torch.device("cpu"))


def path_functions() -> dict:
    """Each benchmarked path as ``f(model, batch, with_entropy)``."""
    from ggpo_offline.train.logprobs import full_vocab_logprobs, response_logprobs

    return {
        "full": full_vocab_logprobs,
        "padded": functools.partial(response_logprobs, forward_tokens=None, packed=False),
        "length-sorted": functools.partial(response_logprobs, packed=False),
        "packed": response_logprobs,
    }


def measure(path: str, vocab: int, shape: str, steps: int, profile: bool = False) -> dict:
    """One process: build the model, run warm-up + ``steps`` learner steps, report tokens/s, peak RSS and
    (``profile``) the self CPU time of the step's operators by kind."""
    from ggpo_offline.train.losses import ggpo_loss

    sizes = dict(SHAPES[shape])
    groups, m = sizes.pop("groups"), sizes.pop("m")
    model = random_qwen3({**sizes, "vocab_size": vocab})
    compute = path_functions()[path]
    batch = _batch(vocab, groups=groups, m=m, prompt=64, lengths=LENGTHS[shape], seed=0)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        logp, _ = compute(model, batch, with_entropy=True)
        out = ggpo_loss(logp, logp.detach(), batch.mask, batch.rewards, group_size=m, beta=0.01)
        out.loss.backward()

    step()  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        step()
    seconds = (time.perf_counter() - start) / steps
    result = {
        "path": path, "vocab": vocab, "tokens": int(batch.mask.sum()), "seconds": seconds,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "positions": int(batch.attention_mask.sum()), "padded": batch.input_ids.numel(),
        "flops": useful_flops({**sizes, "vocab_size": vocab}, batch),
    }  # fmt: skip
    if profile:
        result["profile"] = _profile(step)
    return result


OPERATOR_KINDS = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"),
    "attention": ("aten::_scaled_dot_product",),
    "softmax / log-softmax": ("aten::logsumexp", "aten::_log_softmax", "aten::_softmax", "aten::exp"),
}


def _profile(step) -> dict[str, float]:
    """Seconds of self CPU time per operator kind in one step (the rest: elementwise, copies, norms)."""
    from torch.profiler import profile

    with profile() as recorded:
        step()
    totals = dict.fromkeys([*OPERATOR_KINDS, "other"], 0.0)
    for event in recorded.key_averages():
        kind = next((k for k, prefixes in OPERATOR_KINDS.items() if event.key.startswith(prefixes)), "other")
        totals[kind] += event.self_cpu_time_total / 1e6
    return totals


def _run(path: str, vocab: int, shape: str, steps: int, profile: bool = False) -> dict:
    command = [sys.executable, __file__, "--steps", str(steps), "--one", path, str(vocab), shape]
    out = subprocess.run(
        command + (["--profile"] if profile else []), capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _table(results: dict, key_name: str, peak: float) -> None:
    """Rows grouped by their first key; ratios against that group's first path."""
    print(
        f"| {key_name} | path | tokens/s | useful GFLOP/s | of matmul peak | peak RSS (MB) | tokens/s ratio "
        "| peak RSS ratio |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for (key, path), r in results.items():
        base = next(v for (k, _), v in results.items() if k == key)
        rate, base_rate, achieved = (
            r["tokens"] / r["seconds"],
            base["tokens"] / base["seconds"],
            r["flops"] / r["seconds"],
        )
        print(
            f"| {key:,} | {path} | {rate:,.0f} | {achieved / 1e9:,.1f} | {achieved / peak:.1%} | "
            f"{r['peak_rss_mb']:,.0f} | {rate / base_rate:.2f}x | "
            f"{r['peak_rss_mb'] / base['peak_rss_mb']:.2f}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--one", nargs=3, metavar=("PATH", "VOCAB", "SHAPE"), help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]), args.one[2], args.steps, args.profile)))
        return
    peak = matmul_peak()
    print(f"fp32 matmul peak of this machine (2048² matmuls, same run): {peak / 1e9:,.1f} GFLOP/s\n")
    print("### 1. The output head: chunked log-probs vs the full-vocabulary log-softmax\n")
    print("Synthetic Qwen3, hidden 64, 2 layers, tied head; one group of 4 responses of 256-1024 tokens")
    print("(prompt 64). Ratios against `full` of the same vocabulary; a hidden size of 64 keeps every path")
    print("memory-bound, far from the matmul peak.\n")
    _table({(v, p): _run(p, v, "head", args.steps) for v in VOCABS for p in HEAD_PATHS}, "vocab", peak)
    vocab = 152_000
    layouts = {
        (vocab, p): _run(p, vocab, "realistic", REALISTIC_STEPS, profile=p == "packed") for p in LAYOUT_PATHS
    }
    sample = layouts[vocab, "packed"]
    full_logits_gb = sample["padded"] * vocab * 4 / 1e9
    print("\n### 2. Realistic shape: padded, length-sorted and packed forwards\n")
    print(
        f"Random-init Qwen3, hidden 1,024, 8 layers, 16/8 heads (head dim 64), MLP 3,072, vocabulary "
        f"{vocab:,} (tied); one group of 8 responses of 128-1,024 tokens after a 64-token prompt: "
        f"{sample['positions']:,} real positions, {sample['padded']:,} when padded to the longest row "
        f"({1 - sample['positions'] / sample['padded']:.0%} padding), {sample['tokens']:,} response tokens. "
        f"Useful work {sample['flops'] / 1e12:.2f} TFLOP per step (`useful_flops`).\n"
    )
    _table(layouts, "vocab", peak)
    print(
        f"\nRatios against `padded` (one padded forward, chunked head). The straightforward `full` path is "
        f"not run here: its fp32 logits alone take {full_logits_gb:.1f} GB, and with their log-softmax and "
        "gradients the process was killed for memory on a 24 GB machine."
    )
    total = sum(sample["profile"].values())
    shares = ", ".join(f"{kind} {seconds / total:.0%}" for kind, seconds in sample["profile"].items())
    print(f"\nWhere the packed step's time goes (self CPU time by operator, torch profiler): {shares}.")


if __name__ == "__main__":
    main()
