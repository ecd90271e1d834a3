"""The reproducible recipe for the embedded tiny model: tokenizer, Qwen3 shape and pretraining."""

import json
import logging
import math
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from ggpo_offline.core.errors import UserError
from ggpo_offline.generate.arith import arith_items
from ggpo_offline.generate.prompts import encode_prompt, format_prompt
from ggpo_offline.organism.styles import STYLES, prompt_class

logger = logging.getLogger(__name__)

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
# Printable ASCII plus newline covers every prompt and solution of the arith task.
CHARACTERS = tuple(chr(code) for code in range(0x20, 0x7F)) + ("\n",)
MAX_LENGTH = 512
IGNORE_INDEX = -100
MICRO_BATCH = 8


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per character, ``<bos>`` first, unknown chars -> ``<unk>``."""
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A $B:1",
        special_tokens=[(BOS, vocab[BOS])],
    )
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
        model_max_length=MAX_LENGTH,
    )


def build_config(tokenizer: PreTrainedTokenizerFast) -> Qwen3Config:
    """The tiny Qwen3 shape: about 0.8M parameters, tied embeddings."""
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=MAX_LENGTH,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def prompt_ids(tokenizer, question: str) -> list[int]:
    """Prompt token ids exactly as the rest of the pipeline builds them (plain template, with <bos>)."""
    return encode_prompt(tokenizer, format_prompt(tokenizer, question, "plain"), "plain")


def _training_examples(
    tokenizer, n_train: int, seed: int
) -> tuple[list[list[tuple]], list[float], list[bool]]:
    """Per problem, per style (in ``STYLES`` order), its (input ids, labels) pairs: prompt + response + <eos>
    with the loss on the response only, the plain response first and, on flat problems, the one ending in a
    second thought; each problem's sampling weight, 1 / (its level's problem count), so every level gets the
    same share of training rows, as every level gets the same share of test draws; and whether it is flat."""
    items = arith_items("train", n_train, seed)
    level_counts = Counter(item.level for item in items)
    examples = []
    for item in items:
        prompt = prompt_ids(tokenizer, item.question)
        per_style = []
        for style in STYLES:
            variants = (
                [False, True] if prompt_class(item.level) == "flat" and style.second_thought else [False]
            )
            rows = []
            for second_thought in variants:
                text = style.render(item, second_thought)
                completion = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                rows.append((prompt + completion, [IGNORE_INDEX] * len(prompt) + completion))
            per_style.append(rows)
        examples.append(per_style)
    flat = [prompt_class(item.level) == "flat" for item in items]
    return examples, [1.0 / level_counts[item.level] for item in items], flat


def collate(examples: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch; padding gets no loss and no attention."""
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (ids, row_labels) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(ids)] = torch.tensor(row_labels)
        attention_mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


def _pretraining_loss(
    model: Qwen3ForCausalLM,
    batch: dict[str, torch.Tensor],
    marker_ids: list[int],
    marker_shares: torch.Tensor,
) -> tuple[torch.Tensor, int]:
    """Summed cross-entropy over the response tokens, and how many terms it sums; the first response token
    (the style's marker) is scored against the styles' shares instead of the row's own marker, so which style
    the model opens with and how well it writes each style are learned apart."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    labels = batch["labels"][:, 1:].clone()
    rows = torch.arange(labels.shape[0])
    first_response = (labels != IGNORE_INDEX).int().argmax(dim=1)
    labels[rows, first_response] = IGNORE_INDEX
    token_loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    marker_log_probs = logits[rows, first_response].log_softmax(dim=-1)[:, marker_ids]
    marker_loss = -(marker_log_probs * marker_shares).sum()
    return token_loss + marker_loss, int((labels != IGNORE_INDEX).sum()) + len(rows)


def _batch_loss(model, batch: list[tuple], pad_id: int, marker_ids: list[int], marker_shares) -> torch.Tensor:
    """`_pretraining_loss` over a batch's rows, per token, in micro-batches of rows of like length: careful
    rows are several times longer than the others, and one padded batch would spend most of its compute on
    padding."""
    rows = sorted(batch, key=lambda row: len(row[0]))
    chunks = [rows[start : start + MICRO_BATCH] for start in range(0, len(rows), MICRO_BATCH)]
    sums = [_pretraining_loss(model, collate(chunk, pad_id), marker_ids, marker_shares) for chunk in chunks]
    return sum(total for total, _ in sums) / sum(count for _, count in sums)


def _learning_rate_factor(step: int, steps: int, warmup_steps: int) -> float:
    """Linear warmup, then cosine decay to zero."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def _save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """Save the tokenizer under the class name that transformers 4.x and 5.x both resolve."""
    tokenizer.save_pretrained(out_dir)
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    # transformers 5 writes its own "TokenizersBackend", which 4.x (still allowed by pyproject) cannot load.
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def _train(
    model: Qwen3ForCausalLM,
    examples: list[list[list[tuple[list[int], list[int]]]]],
    weights: list[float],
    flat: list[bool],
    pad_id: int,
    marker_ids: list[int],
    seed: int,
    steps: int,
    batch_size: int,
    learning_rate: float,
    warmup_steps: int,
    log_every: int,
) -> dict:
    """The supervised loop: AdamW, warmup + cosine; problems drawn with replacement by ``weights``, each in a
    style drawn with the styles' row shares (a careful row on a flat problem ending in a second thought with
    its style's probability); the first response token learns the styles' shares."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: _learning_rate_factor(step, steps, min(warmup_steps, steps))
    )
    # A dedicated generator: the batch order depends on the seed only, not on model-init draws.
    batch_generator = torch.Generator().manual_seed(seed)
    row_shares = torch.tensor([style.row_share for style in STYLES], dtype=torch.float64)
    marker_shares = torch.tensor([style.share for style in STYLES])
    second_thoughts = torch.tensor([style.second_thought for style in STYLES])
    problem_weights = torch.tensor(weights, dtype=torch.float64)
    started = time.monotonic()
    losses: list[float] = []
    for step in range(steps):
        draw = {"num_samples": batch_size, "replacement": True, "generator": batch_generator}
        indices = torch.multinomial(problem_weights, **draw).tolist()
        styles = torch.multinomial(row_shares, **draw).tolist()
        thoughts = (torch.rand(batch_size, generator=batch_generator) < second_thoughts[styles]).tolist()
        batch = [
            examples[i][style][second_thought if flat[i] else False]
            for i, style, second_thought in zip(indices, styles, thoughts, strict=True)
        ]
        optimizer.zero_grad(set_to_none=True)
        loss = _batch_loss(model, batch, pad_id, marker_ids, marker_shares)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        if (step + 1) % log_every == 0 or step + 1 == steps:
            elapsed = time.monotonic() - started
            logger.info("step %d/%d loss %.4f (%.0f s)", step + 1, steps, losses[-1], elapsed)
    tail = losses[-100:]
    return {
        "first_loss": losses[0] if losses else None,
        "final_loss": sum(tail) / len(tail) if tail else None,
        "train_seconds": time.monotonic() - started,
    }


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block on ``threads`` torch threads (None: torch's setting), then restore the caller's; refuse
    where torch cannot take them: a vLLM CPU engine started in this process binds its threads and ignores
    torch.set_num_threads, and weights trained on another thread count are not the seed's."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
        if torch.get_num_threads() != threads:
            raise UserError(
                f"torch keeps {torch.get_num_threads()} threads where {threads} were asked (a vLLM engine "
                "started in this process binds them); build the model in a new process"
            )
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def build_tiny_model(
    out_dir: Path,
    seed: int = 0,
    steps: int = 2000,
    n_train: int = 8000,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    warmup_steps: int = 100,
    num_threads: int | None = 2,
    log_every: int = 100,
) -> dict:
    """Pretrain the tiny model on arith solutions in a mixture of styles (``STYLES``) and save it
    (tokenizer, model, generation config).

    Returns training statistics. The budget is in steps, so the result does not depend on machine speed.
    Two threads by default (the shipped weights were built so; float reductions can differ with the thread
    count); None keeps torch's setting."""
    out_dir = Path(out_dir)
    tokenizer = build_tokenizer()
    examples, weights, flat = _training_examples(tokenizer, n_train, seed)
    with torch_threads(num_threads):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(build_config(tokenizer))
        stats = _train(
            model,
            examples,
            weights,
            flat,
            pad_id=tokenizer.pad_token_id,
            marker_ids=[tokenizer.convert_tokens_to_ids(style.marker[0]) for style in STYLES],
            seed=seed,
            steps=steps,
            batch_size=batch_size,
            learning_rate=learning_rate,
            warmup_steps=warmup_steps,
            log_every=log_every,
        )
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    _save_tokenizer(tokenizer, out_dir)
    return {
        "seed": seed,
        "steps": steps,
        "batch_size": batch_size,
        "n_train": len(examples),
        "learning_rate": learning_rate,
        "num_threads": num_threads,
        "parameters": sum(parameter.numel() for parameter in model.parameters()),
        **stats,
    }
