"""Benchmark 3: generation tokens/s of the vLLM and hf engines on the embedded model, pool defaults."""

import argparse
import time


def measure(engine_name: str, prompts: int) -> dict:
    from ggpo_offline.core.model_io import load_tokenizer, resolve_model_dir
    from ggpo_offline.generate.datasets import load_dataset
    from ggpo_offline.generate.engines import SamplingSettings, load_engine, prompt_seed
    from ggpo_offline.generate.rollout import encode_prompts

    model_dir = resolve_model_dir(None)
    tokenizer = load_tokenizer(model_dir)
    problems, _ = load_dataset("arith:train", limit=prompts, seed=0)
    _, prompt_ids = encode_prompts(tokenizer, problems, "plain")
    sampling = SamplingSettings()  # the pool defaults: m 8, temperature 1, 128 tokens
    start = time.perf_counter()
    engine = load_engine(engine_name, model_dir, "auto", 512, 0)
    started = time.perf_counter()
    seeds = [prompt_seed(sampling.seed, p.prompt_id) for p in problems]
    groups = engine.generate(prompt_ids, seeds, sampling)
    seconds = time.perf_counter() - started
    engine.close()
    tokens = sum(len(s.token_ids) for group in groups for s in group)
    return {"engine": engine_name, "start_s": started - start, "seconds": seconds, "tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=256)
    args = parser.parse_args()
    results = [measure(name, args.prompts) for name in ("hf", "vllm")]
    base = results[0]["tokens"] / results[0]["seconds"]
    print(f"{args.prompts} prompts x m = 8, temperature 1.0, max 128 tokens, embedded tiny model\n")
    print("| engine | start (s) | generated tokens | tokens/s | ratio vs hf |")
    print("|---|---:|---:|---:|---:|")
    for r in results:
        rate = r["tokens"] / r["seconds"]
        print(f"| {r['engine']} | {r['start_s']:.1f} | {r['tokens']:,} | {rate:,.0f} | {rate / base:.1f}x |")


if __name__ == "__main__":
    main()
