"""Turn a problem into the prompt text and token ids the model sees."""

from typing import Literal

SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
USER_SUFFIX = "Let's think step by step and output the final answer within \\boxed{}."
PLAIN_TEMPLATE = "Question: {problem} " + USER_SUFFIX + "\nAnswer: "

Template = Literal["auto", "chat", "plain"]


def resolve_template(tokenizer, template: Template) -> Literal["chat", "plain"]:
    """``auto`` means the chat template when the tokenizer has one, else the plain template."""
    if template == "auto":
        return "chat" if getattr(tokenizer, "chat_template", None) else "plain"
    return template


def format_prompt(tokenizer, problem: str, template: Literal["chat", "plain"]) -> str:
    """The prompt text: paper system prompt + problem + paper user suffix, or the plain template."""
    if template == "chat":
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"{problem} {USER_SUFFIX}"},
        ]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return PLAIN_TEMPLATE.replace("{problem}", problem)  # not str.format: the suffix holds "{}"


def encode_prompt(tokenizer, text: str, template: Literal["chat", "plain"]) -> list[int]:
    """Token ids of a formatted prompt; a chat template already holds its special tokens."""
    return tokenizer(text, add_special_tokens=(template == "plain"))["input_ids"]


def template_description(template: Literal["chat", "plain"]) -> dict:
    """What the pool metadata records about prompt formatting."""
    if template == "chat":
        return {"kind": "chat", "system_prompt": SYSTEM_PROMPT, "user_suffix": USER_SUFFIX}
    return {"kind": "plain", "template": PLAIN_TEMPLATE}
