"""Benchmarks 1 and 2: learner step (forward + backward + GGPO loss) tokens/s and peak RSS, and its
achieved FLOP/s (≈ 6 · params · tokens) as a fraction of this machine's matmul peak.

Paths: ``full`` is the straightforward one (one padded forward, full-vocabulary fp32 log-softmax,
`full_vocab_logprobs`); ``chunked`` adds the chunked head/log-softmax on one padded forward; ``trainer``
is what training runs (chunked, rows in length-sorted forwards of ``FORWARD_TOKENS`` positions). Each
measurement runs in its own process so that its peak RSS is its own; printed as ratios against ``full``
measured in the same run on the same machine. Tokens/s counts response tokens, never padding.
"""

import argparse
import functools
import json
import resource
import subprocess
import sys
import time

VOCABS = (32_000, 152_000)
PATHS = ("full", "chunked", "trainer")


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
    # Deeper, wider decoder and two groups: the decoder dominates, so padding shows (benchmark 1b).
    "decoder": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64, groups=2, m=4),
}  # fmt: skip


def measure(path: str, vocab: int, shape: str, steps: int) -> dict:
    """One process: build the model, run warm-up + ``steps`` learner steps, report tokens/s and peak RSS."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from ggpo_offline.losses import ggpo_loss
    from ggpo_offline.train.logprobs import full_vocab_logprobs, response_logprobs

    one_padded_forward = functools.partial(response_logprobs, forward_tokens=10**12)

    torch.manual_seed(0)
    sizes = dict(SHAPES[shape])
    groups, m = sizes.pop("groups"), sizes.pop("m")
    config = Qwen3Config(vocab_size=vocab, max_position_embeddings=2048, tie_word_embeddings=True, **sizes)
    model = Qwen3ForCausalLM(config)
    compute = {"full": full_vocab_logprobs, "chunked": one_padded_forward, "trainer": response_logprobs}[path]
    batch = _batch(vocab, groups=groups, m=m, prompt=64, lengths=(256, 1024), seed=0)
    tokens = int(batch.mask.sum())
    processed = int(batch.attention_mask.sum())  # prompt + response tokens, what a step must process

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
            "peak_rss_mb": peak_mb, "params": params, "padded": batch.input_ids.numel()}  # fmt: skip


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


def _run(path: str, vocab: int, shape: str, steps: int) -> dict:
    command = [sys.executable, __file__, "--steps", str(steps), "--one", path, str(vocab), shape]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _table(results: dict, key_name: str) -> None:
    """Rows grouped by their first key; ratios against that group's first path."""
    print(f"| {key_name} | path | tokens/s | peak RSS (MB) | tokens/s ratio | peak RSS ratio |")
    print("|---:|---|---:|---:|---:|---:|")
    for (key, path), r in results.items():
        base = next(v for (k, _), v in results.items() if k == key)
        rate, base_rate = r["tokens"] / r["seconds"], base["tokens"] / base["seconds"]
        print(
            f"| {key:,} | {path} | {rate:,.0f} | {r['peak_rss_mb']:,.0f} | "
            f"{rate / base_rate:.2f}x | {r['peak_rss_mb'] / base['peak_rss_mb']:.2f}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--one", nargs=3, metavar=("PATH", "VOCAB", "SHAPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]), args.one[2], args.steps)))
        return
    vocab_study = {(vocab, path): _run(path, vocab, "head", args.steps) for vocab in VOCABS for path in PATHS}
    print("Synthetic Qwen3, hidden 64, 2 layers, tied head; one group of 4 responses of 256-1024 tokens")
    print("(prompt 64). Tokens/s counts response tokens; ratios against `full` of the same vocabulary.\n")
    _table(vocab_study, "vocab")
    peak = matmul_peak_flops()
    print(f"\nfp32 matmul peak of this machine (1024² matmuls, same run): {peak / 1e9:,.1f} GFLOP/s\n")
    print("| vocab | path | params | GFLOP/s (6·params·tokens) | fraction of matmul peak |")
    print("|---:|---|---:|---:|---:|")
    for (vocab, path), r in vocab_study.items():
        achieved = 6 * r["params"] * r["processed"] / r["seconds"]
        print(f"| {vocab:,} | {path} | {r['params']:,} | {achieved / 1e9:,.1f} | {achieved / peak:.1%} |")
    padding_study = {(32_000, path): _run(path, 32_000, "decoder", args.steps) for path in PATHS[1:]}
    sample = padding_study[32_000, "chunked"]
    print("\n### 1b. Padding: one padded forward vs length-sorted forwards\n")
    print(
        f"Synthetic Qwen3, hidden 256, 4 layers, vocab 32,000; two groups of 4 responses of 256-1024 tokens: "
        f"{sample['processed']:,} real positions, {sample['padded']:,} when padded to the longest row "
        f"({1 - sample['processed'] / sample['padded']:.0%} padding). Both use the chunked head.\n"
    )
    _table(padding_study, "vocab")


if __name__ == "__main__":
    main()
