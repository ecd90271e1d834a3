"""`make gpu-check`: the learners and the log-prob path on CUDA against the CPU, and the learner step at the
paper's geometry on a random-init Qwen3-1.7B-shaped model; writes a markdown report.

Made for a bare GPU machine with PyTorch and transformers only: the learners and the log-prob path import
nothing else, and a section that needs more (the short `ggpo train`: pyarrow, polars, MLflow, ...) is
skipped with the reason printed. ``--cpu`` runs every section at toy sizes on the CPU, as `make test`
does, so the script cannot rot where no GPU is lent.
"""

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from learner_step import _batch, matmul_peak, path_functions, random_qwen3, sync, useful_flops  # noqa: E402

# Qwen3-1.7B-Base (its config.json) and the paper's offline geometry (SPEC "Paper defaults"): G·m = 256
# responses of up to 2,048 tokens, micro-batches of whole groups.
QWEN3_17B = dict(
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151_936,
)
TOY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    vocab_size=4_096,
)
GEOMETRY = {"gpu": dict(groups=32, m=8, prompt=128, lengths=(256, 2048), micro_groups=1),
            "cpu": dict(groups=2, m=4, prompt=16, lengths=(8, 48), micro_groups=1)}  # fmt: skip


def _learner_inputs(seed: int, dtype: torch.dtype, G: int = 3, m: int = 4, T: int = 9) -> dict:
    gen = torch.Generator().manual_seed(seed)
    B = G * m
    logp = -3 * torch.rand(B, T, generator=gen, dtype=torch.float64)
    lengths = torch.randint(2, T + 1, (B,), generator=gen)
    rewards = (torch.rand(B, generator=gen) < 0.5).double()
    rewards[::m], rewards[1::m] = 1.0, 0.0
    inputs = {
        "logp": logp, "old_logp": logp + 0.1 * torch.randn(B, T, generator=gen, dtype=torch.float64),
        "behavior_logp": logp + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64),
        "ref_logp": logp + 0.2 * torch.randn(B, T, generator=gen, dtype=torch.float64),
        "mask": (torch.arange(T) < lengths[:, None]).double(), "rewards": rewards,
    }  # fmt: skip
    return {k: v.to(dtype) for k, v in inputs.items()}


def check_losses(device: torch.device) -> list[str]:
    """Every registered learner in fp32 on ``device`` against fp64 on the CPU (loss and gradient), and
    under bf16 autocast on ``device`` (finite)."""
    from ggpo_offline.train.learners import LEARNERS

    rows = ["| method | max abs Δ loss | max abs Δ gradient | under autocast |", "|---|---:|---:|---|"]
    for name, learner in LEARNERS.items():
        results = {}
        for where, dtype in (("reference", torch.float64), ("device", torch.float32)):
            target = torch.device("cpu") if where == "reference" else device
            loss, logp = _learner_loss(learner, _learner_inputs(0, dtype), target)
            (grad,) = torch.autograd.grad(loss, logp)
            results[where] = (loss.double().cpu(), grad.double().cpu())
        reference, measured = results["reference"][0], results["device"][0]
        # A rejection that keeps no token gives verl's own NaN (0/0, zero gradient), in either precision.
        none_kept = bool(reference.isnan() and measured.isnan())
        loss_gap = 0.0 if none_kept else (measured - reference).abs().item()
        grad_gap = (results["device"][1] - results["reference"][1]).abs().max().item()
        assert loss_gap < 1e-5 and grad_gap < 1e-6, (name, loss_gap, grad_gap)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss, logp = _learner_loss(learner, _learner_inputs(1, torch.float32), device)
            loss.backward()
        undefined = bool(loss.isnan() and (logp.grad == 0).all())  # verl's NaN again, nothing learned
        assert (torch.isfinite(loss) or undefined) and torch.isfinite(logp.grad).all(), name
        outcome = "NaN loss, zero gradient (no token kept)" if undefined else "finite"
        rows.append(f"| {name} | {loss_gap:.1e} | {grad_gap:.1e} | {outcome} |")
    return rows


def _learner_loss(learner, inputs: dict, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(the learner's loss at its default hyperparameters, the log-probs it is differentiated in)."""
    from ggpo_offline.train.config import TrainConfig

    inputs = {k: v.to(device) for k, v in inputs.items()}
    logp = inputs.pop("logp").requires_grad_()
    tensors = {k: v for k, v in inputs.items() if k in learner.needs or k in ("mask", "rewards")}
    hyperparameters = learner.loss_kwargs(TrainConfig(method=learner.name))
    return learner.loss(logp, **tensors, group_size=4, **hyperparameters).loss, logp


def check_logprobs(device: torch.device) -> list[str]:
    """The trainer's log-prob path on ``device`` (its numerics: bf16 autocast on CUDA) against the CPU in
    fp32, against the straightforward full-vocabulary path and against length-sorted padded forwards on
    the same device (values, gradients)."""
    from ggpo_offline.train.logprobs import response_logprobs

    shape = dict(TOY, hidden_size=128, num_hidden_layers=2, vocab_size=8_192)
    batch = _batch(shape["vocab_size"], groups=2, m=4, prompt=16, lengths=(8, 64), seed=1)
    cpu_model = random_qwen3(shape, torch.device("cpu"))
    with torch.no_grad():
        cpu_logp, _ = response_logprobs(cpu_model, batch)
    model = random_qwen3(shape, device)
    results, paths = {}, path_functions()
    for name in ("packed", "full", "length-sorted"):
        model.zero_grad(set_to_none=True)
        logp, _ = paths[name](model, batch, with_entropy=True)
        (logp * batch.mask.to(device)).sum().backward()
        results[name] = (logp.detach().cpu(), model.model.layers[0].mlp.up_proj.weight.grad.detach().cpu())
    mask = batch.mask.bool()
    tolerance = 5e-2 if device.type == "cuda" else 1e-4  # bf16 autocast on CUDA, fp32 on the CPU
    lines = [
        f"Numerics on {device.type}: "
        f"{'bf16 autocast, fp32 weights' if device.type == 'cuda' else 'fp32'}. Largest differences over "
        f"{int(batch.mask.sum())} tokens of the trainer's path (packed forwards, chunked head):",
        "",
        f"- vs the CPU in fp32: {(results['packed'][0] - cpu_logp)[mask].abs().max().item():.2e} nats",
    ]
    assert (results["packed"][0] - cpu_logp)[mask].abs().max() < tolerance
    for other in ("full", "length-sorted"):
        value_gap = (results["packed"][0] - results[other][0])[mask].abs().max().item()
        grad_gap = (results["packed"][1] - results[other][1]).abs().max().item()
        grad_scale = results[other][1].abs().max().item()
        assert value_gap < tolerance and grad_gap < tolerance * max(grad_scale, 1), (
            other,
            value_gap,
            grad_gap,
        )
        lines.append(
            f"- vs the {other} path, same device: {value_gap:.2e} nats; gradient {grad_gap:.2e} (largest "
            f"entry {grad_scale:.2e})"
        )
    return lines


def learner_step(device: torch.device, cpu_mode: bool) -> list[str]:
    """Forward + backward + GGPO loss over every micro-batch of one minibatch, for the trainer's path
    (packed), length-sorted padded forwards and the straightforward one: tokens/s, useful FLOP/s as a
    fraction of the matmul peak, peak memory."""
    shape = TOY if cpu_mode else QWEN3_17B
    geometry = dict(GEOMETRY["cpu" if cpu_mode else "gpu"])
    micro_groups = geometry.pop("micro_groups")
    model = random_qwen3(shape, device)
    batch = _batch(shape["vocab_size"], seed=0, **geometry)
    micros = batch.split(micro_groups * batch.group_size)
    tokens, processed = int(batch.mask.sum()), int(batch.attention_mask.sum())
    params = sum(p.numel() for p in model.parameters())
    peak_dtype = torch.float32 if cpu_mode else torch.bfloat16
    peak = matmul_peak(device, peak_dtype, 512 if cpu_mode else 8192)
    flops = useful_flops(shape, batch)
    rows = [
        f"Random-init Qwen3 ({params / 1e6:,.1f}M parameters, hidden {shape['hidden_size']}, "
        f"{shape['num_hidden_layers']} layers, vocabulary {shape['vocab_size']:,}); {batch.num_responses} "
        f"responses in groups of {batch.group_size}, {len(micros)} micro-batches of {micro_groups} group(s); "
        f"{tokens:,} response tokens, {processed:,} positions, {flops / 1e12:,.1f} TFLOP of useful work. "
        f"Matmul peak measured in this run ({peak_dtype}): {peak / 1e12:,.2f} TFLOP/s.",
        "",
        "| path | seconds per minibatch | tokens/s | useful FLOP/s / peak | peak memory (GB) |",
        "|---|---:|---:|---:|---:|",
    ]
    names = {"packed": "trainer (packed, chunked head)", "length-sorted": "length-sorted padded",
             "full": "straightforward (padded, full vocabulary)"}  # fmt: skip
    paths = path_functions()
    for path, name in names.items():
        try:
            seconds, memory = _time_step(model, micros, paths[path], tokens, device)
        except torch.OutOfMemoryError:
            rows.append(f"| {name} | out of memory | | | |")
            torch.cuda.empty_cache()
            continue
        rate, mfu = tokens / seconds, flops / seconds / peak
        rows.append(f"| {name} | {seconds:.2f} | {rate:,.0f} | {mfu:.1%} | {memory:.1f} |")
    return rows


def _time_step(model, micros, path, tokens: int, device: torch.device) -> tuple[float, float]:
    """(seconds of one minibatch after a warm-up one, peak device memory in GB: NaN on the CPU)."""
    from ggpo_offline.train.losses import ggpo_loss

    def step() -> None:
        model.zero_grad(set_to_none=True)
        for micro in micros:
            logp, _ = path(model, micro, with_entropy=True)
            mask, rewards = micro.mask.to(device), micro.rewards.to(device)
            out = ggpo_loss(logp, logp.detach(), mask, rewards, group_size=micro.group_size, beta=0.01,
                            token_count=tokens)  # fmt: skip
            out.loss.backward()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step()
    sync(device)
    start = time.perf_counter()
    step()
    sync(device)
    seconds = time.perf_counter() - start
    memory = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else float("nan")
    return seconds, memory


def short_train(tmp: Path) -> list[str]:
    """`ggpo train` for two updates on a pool the hf engine samples from the embedded model, when the
    package's other dependencies are installed; otherwise the reason it was skipped."""
    try:
        from ggpo_offline.generate.engines import SamplingSettings
        from ggpo_offline.generate.pipeline import GenerateConfig, generate_pool
        from ggpo_offline.train.config import TrainConfig
        from ggpo_offline.train.trainer import train
    except ImportError as error:
        return [f"Skipped: {error} (the GPU machine has PyTorch and transformers only)."]
    sampling = SamplingSettings(m=4, max_tokens=64, seed=3)
    pool = generate_pool(
        GenerateConfig(
            num_prompts=24,
            sampling=sampling,
            engine="hf",
            dtype="float32",
            out=tmp / "pool.parquet",
            reward_workers=0,
        )  # fmt: skip
    )
    start = time.perf_counter()
    result = train(TrainConfig(pool=pool, updates=2, groups_per_batch=2, lr=1e-4, no_tracking=True,
                               out=tmp / "run"))  # fmt: skip
    seconds, first = time.perf_counter() - start, result.metrics[0]
    k3, drift, ess = first["mismatch/k3"], first["mismatch/drift"], first["mismatch/ess"]
    return [
        f"2 updates in {seconds:.1f} s; update 0: mismatch/k3 {k3:.2e}, drift {drift:.2e}, ESS {ess:.4f} (a "
        "float32 pool from the hf engine, so on CUDA these measure the bf16 learner's distance from it)."
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cpu", action="store_true", help="toy sizes on the CPU (what make test runs)")
    parser.add_argument("--out", type=Path, default=Path("bench/gpu-results.md"))
    parser.add_argument("--tmp", type=Path, default=Path("/tmp/ggpo-gpu-check"))
    args = parser.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        sys.exit("error: no CUDA device; run with --cpu for the reduced check")
    device = torch.device("cpu" if args.cpu else "cuda")
    where = "CPU (reduced mode)" if args.cpu else torch.cuda.get_device_name(device)
    sections = [
        ("1. Learners on the device vs fp64 on the CPU", check_losses(device)),
        ("2. The log-prob path", check_logprobs(device)),
        ("3. Learner step at the paper's geometry", learner_step(device, args.cpu)),
        ("4. A short `ggpo train`", short_train(args.tmp)),
    ]
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# GPU check\n\n`make gpu-check` on {where}, torch {torch.__version__}, {stamp}.\n"]
    for title, rows in sections:
        lines += [f"## {title}", "", *rows, ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
