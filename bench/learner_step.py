"""Benchmarks 1 and 2: learner step (forward + backward + GGPO loss) tokens/s and peak RSS, chunked vs
full-vocab, and its achieved FLOP/s (≈ 6 · params · tokens) as a fraction of this machine's matmul peak.

Each measurement runs in its own process so that its peak RSS is its own. Printed as ratios against the
straightforward path (`full_vocab_logprobs`) measured in the same run on the same machine.
"""

import argparse
import json
import resource
import subprocess
import sys
import time

VOCABS = (32_000, 152_000)
PATHS = ("full", "chunked")


def _batch(vocab: int, groups: int, m: int, prompt: int, lengths: tuple[int, int], seed: int):
    import torch

    from ggpo_offline.train.batch import Minibatch

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


def measure(path: str, vocab: int, steps: int) -> dict:
    """One process: build the model, run warm-up + ``steps`` learner steps, report tokens/s and peak RSS."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from ggpo_offline.losses import ggpo_loss
    from ggpo_offline.train.logprobs import full_vocab_logprobs, response_logprobs

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, max_position_embeddings=2048, tie_word_embeddings=True,
    )  # fmt: skip
    model = Qwen3ForCausalLM(config)
    compute = full_vocab_logprobs if path == "full" else response_logprobs
    batch = _batch(vocab, groups=1, m=4, prompt=64, lengths=(256, 1024), seed=0)
    tokens = int(batch.mask.sum())
    processed = int(batch.attention_mask.sum())  # prompt + response tokens through the decoder

    def step() -> None:
        model.zero_grad(set_to_none=True)
        logp, _ = compute(model, batch, with_entropy=True)
        ref = logp.detach()
        out = ggpo_loss(logp, ref, batch.mask, batch.rewards, group_size=batch.group_size, beta=0.01)
        out.loss.backward()

    step()  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        step()
    seconds = (time.perf_counter() - start) / steps
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    params = sum(p.numel() for p in model.parameters())
    return {"path": path, "vocab": vocab, "tokens": tokens, "processed": processed, "seconds": seconds,
            "peak_rss_mb": peak_mb, "params": params}  # fmt: skip


def matmul_peak_flops(size: int = 1024, seconds: float = 2.0) -> float:
    """This machine's fp32 matmul throughput (FLOP/s) with torch's default threads, best of short bursts."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        for _ in range(4):
            torch.mm(a, b)
        best = max(best, 4 * 2 * size**3 / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--one", nargs=2, metavar=("PATH", "VOCAB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]), args.steps)))
        return
    results = {}
    for vocab in VOCABS:
        for path in PATHS:
            out = subprocess.run(
                [sys.executable, __file__, "--steps", str(args.steps), "--one", path, str(vocab)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            results[path, vocab] = json.loads(out.stdout.strip().splitlines()[-1])
    print("| vocab | path | tokens/s | peak RSS (MB) | tokens/s ratio | peak RSS ratio |")
    print("|---:|---|---:|---:|---:|---:|")
    for vocab in VOCABS:
        base = results["full", vocab]
        for path in PATHS:
            r = results[path, vocab]
            rate, base_rate = r["tokens"] / r["seconds"], base["tokens"] / base["seconds"]
            print(
                f"| {vocab:,} | {path} | {rate:,.0f} | {r['peak_rss_mb']:,.0f} | "
                f"{rate / base_rate:.2f}x | {r['peak_rss_mb'] / base['peak_rss_mb']:.2f}x |"
            )
    peak = matmul_peak_flops()
    print(f"\nfp32 matmul peak of this machine (1024² matmuls, same run): {peak / 1e9:,.1f} GFLOP/s\n")
    print("| vocab | path | params | GFLOP/s (6·params·tokens) | fraction of matmul peak |")
    print("|---:|---|---:|---:|---:|")
    for (path, vocab), r in results.items():
        achieved = 6 * r["params"] * r["processed"] / r["seconds"]
        print(f"| {vocab:,} | {path} | {r['params']:,} | {achieved / 1e9:,.1f} | {achieved / peak:.1%} |")


if __name__ == "__main__":
    main()
