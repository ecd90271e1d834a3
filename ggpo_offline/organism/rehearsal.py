"""A Qwen3 chat checkpoint in miniature (byte-level BPE, chat template), built in seconds."""

import json
import time
from pathlib import Path

import torch
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from ggpo_offline.generate.arith import ArithItem, arith_items
from ggpo_offline.generate.prompts import SYSTEM_PROMPT, USER_SUFFIX, encode_prompt, format_prompt
from ggpo_offline.organism.styles import STYLES
from ggpo_offline.organism.tiny import IGNORE_INDEX, collate, torch_threads

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
"""Qwen's: ``<|endoftext|>`` pads and ends base-model text, ``<|im_start|>``/``<|im_end|>`` frame a chat
turn, and ``<|im_end|>`` is the chat model's EOS."""
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Qwen's chat layout, without its tool-call and thinking branches."""
PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
"""Qwen2/3's split before the byte mapping: one digit per piece, a word with its leading space."""
MAX_VOCAB = 1024
"""The BPE's size limit; the task's text runs out of pairs to merge well before it (about 390 tokens)."""
CORPUS_PROBLEMS = 500
"""Arith train problems whose text (with every style's rendering and the prompt strings) trains the BPE."""
MAX_POSITIONS = 1024
# The short supervised run (`_teach_short_answers`): ~100k tokens, about 3-4 s on one core.
SFT_PROBLEMS = 512
SFT_STEPS = 80
SFT_BATCH = 16
SFT_LEARNING_RATE = 3e-3
BUILD_THREADS = 1
"""Float reductions depend on the thread count: one thread keeps the bytes independent of the core count."""


def _corpus(seed: int) -> list[str]:
    """The BPE's training text: each problem's user turn, worked solution and style renderings, the system
    prompt and the chat roles, each about as often as a pool shows it."""
    texts = []
    for item in arith_items("train", CORPUS_PROBLEMS, seed):
        texts += [
            SYSTEM_PROMPT,
            f"{item.question} {USER_SUFFIX}",
            item.solution,
            "system",
            "user",
            "assistant",
        ]
        texts += [style.render(item) for style in STYLES]
    return texts


def build_tokenizer(seed: int = 0) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on the task's local text, with Qwen's normalizer, split, special tokens and
    chat template.

    Byte-level: every NFC string encodes (no unknown token) and decodes back exactly. The special tokens
    come after the learned vocabulary, as in Qwen, so no special id is 0 and the pad id is a real one."""
    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=MAX_VOCAB - len(SPECIAL_TOKENS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_corpus(seed), trainer=trainer)
    backend.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=MAX_POSITIONS,
    )


def build_config(tokenizer: PreTrainedTokenizerFast) -> Qwen3Config:
    """Qwen3's shape at toy size: attention wider than the residual stream (4 heads x 32 over 64, as
    Qwen3-0.6B's 16 x 128 over 1024), grouped KV heads, tied embeddings; the end of text doubles as BOS and
    pad, ``<|im_end|>`` is the EOS, as in Qwen3's chat checkpoints."""
    endoftext, im_end = tokenizer.convert_tokens_to_ids([ENDOFTEXT, IM_END])
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # vLLM's CPU attention supports it (the tiny model's too)
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=endoftext,
        eos_token_id=im_end,
        pad_token_id=endoftext,
    )


def _response(item: ArithItem, worked: bool) -> str:
    """A chat answer: the worked solution (one operation at a time, often past 32 tokens on the deeper
    levels), or the expression and its value at once (well within them)."""
    if worked:
        return item.solution
    expression = item.question.removeprefix("What is ").removesuffix("?")
    return f"{expression} = {item.answer}. \\boxed{{{item.answer}}}"


def _chat_examples(tokenizer: PreTrainedTokenizerFast, seed: int) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) of chat turns: the prompt exactly as the pipeline encodes it, then a response
    (worked on every other problem, short on the rest) and ``<|im_end|>``, with the loss on the response."""
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    examples = []
    for index, item in enumerate(arith_items("train", SFT_PROBLEMS, seed)):
        prompt = encode_prompt(tokenizer, format_prompt(tokenizer, item.question, "chat"), "chat")
        response = tokenizer(_response(item, worked=index % 2 == 0), add_special_tokens=False)["input_ids"]
        response.append(im_end)
        examples.append((prompt + response, [IGNORE_INDEX] * len(prompt) + response))
    return examples


def _teach_short_answers(
    model: Qwen3ForCausalLM, examples: list[tuple[list[int], list[int]]], pad_id: int, seed: int
) -> float:
    """A few AdamW steps on chat answers, so that samples look like a pool's: most write a ``\\boxed{}``
    answer and stop with ``<|im_end|>`` within ~32 tokens, the long ones are cut at that limit, and a few
    are right by chance (mixed groups to train on). Far too few steps to learn arithmetic. Returns the last
    batch's loss."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=SFT_LEARNING_RATE, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(SFT_STEPS):
        drawn = torch.randint(len(examples), (SFT_BATCH,), generator=generator).tolist()
        loss = model(**collate([examples[i] for i in drawn], pad_id)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    return loss.item()


def _save_tokenizer(tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    """Save under the class name transformers 4.x and 5.x both resolve (see tiny.py's `_save_tokenizer`),
    with the chat template in tokenizer_config.json as well as chat_template.jinja: 4.x releases before the
    separate file read it only there."""
    tokenizer.save_pretrained(out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def build_rehearsal_model(out: Path, seed: int = 0) -> dict:
    """Write a Hugging Face folder shaped like a Qwen3 chat checkpoint: byte-level BPE with Qwen's special
    tokens and chat template, ``<|im_end|>`` and ``<|endoftext|>`` as EOS, a small random Qwen3 taught to
    answer briefly; it runs on both engines on a CPU and rehearses what the character-level tiny model
    cannot (multi-character tokens, special tokens inside prompts, a pad id that is a real token, two EOS).

    No download; a few seconds. The same ``seed`` gives byte-identical files (same library versions).
    Returns the vocabulary size, parameter count, EOS and pad ids, the last training loss and the seconds."""
    started = time.monotonic()
    out = Path(out)
    tokenizer = build_tokenizer(seed)
    endoftext, im_end = tokenizer.convert_tokens_to_ids([ENDOFTEXT, IM_END])
    with torch_threads(BUILD_THREADS), torch.random.fork_rng():  # the caller's random stream stays put
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(build_config(tokenizer))
        final_loss = _teach_short_answers(model, _chat_examples(tokenizer, seed), endoftext, seed)
    model.generation_config = GenerationConfig(
        bos_token_id=endoftext, eos_token_id=[im_end, endoftext], pad_token_id=endoftext
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    _save_tokenizer(tokenizer, out)
    return {
        "vocab_size": len(tokenizer),
        "parameters": sum(parameter.numel() for parameter in model.parameters()),
        "eos_token_ids": [im_end, endoftext],
        "pad_token_id": endoftext,
        "final_loss": round(final_loss, 4),
        "seconds": round(time.monotonic() - started, 2),
    }
