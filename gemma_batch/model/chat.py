"""Google's Gemma 3 chat template, in Python.

`gemma3_chat_template.jinja` beside this file is the official template (what the google/gemma-3-*-it
tokenizers carry); this module renders the same string for every conversation that template
accepts and this text-only engine supports:

    <bos><start_of_turn>user\\n{system}\\n\\n{content | trim}<end_of_turn>\\n
    <start_of_turn>model\\n{content | trim}<end_of_turn>\\n ...
    [<start_of_turn>model\\n]                                  (add_generation_prompt)

* A leading `system` message is not a turn: its content (untrimmed) plus "\\n\\n" is prepended to the
  first user turn's trimmed content.
* `assistant` is written as `model`; turns must alternate user, model, user, ... from a user turn.
* Content is a string or a list of `{"type": "text", "text": ...}` items, each trimmed, concatenated.

Where the Jinja template would render something odd instead of failing, this module raises
`ValueError`: image items (no vision tower here), unknown item types or roles, a conversation with
no turns, and a list-valued system message of more than one item (the template keeps only the first).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .tokenizer import Tokenizer

BOS = "<bos>"
START_OF_TURN = "<start_of_turn>"
END_OF_TURN = "<end_of_turn>"
GENERATION_PROMPT = f"{START_OF_TURN}model\n"
_TURN_ROLES = {"user": "user", "assistant": "model", "model": "model"}


def _message(messages: Sequence[Any], index: int) -> tuple[str, Any]:
    """(role, content) of messages[index], checked to be a mapping holding both."""
    msg = messages[index]
    if not isinstance(msg, Mapping):
        raise ValueError(f"message {index}: expected a dict with 'role' and 'content', got {type(msg).__name__}")
    if "role" not in msg or "content" not in msg:
        raise ValueError(f"message {index}: missing {'role' if 'role' not in msg else 'content'!r}")
    return msg["role"], msg["content"]


def _text_items(content: Sequence[Any], index: int, role: str) -> list[str]:
    """The texts of a list-valued content; raises on image or unknown items."""
    texts = []
    for j, item in enumerate(content):
        kind = item.get("type") if isinstance(item, Mapping) else None
        if kind == "text" and isinstance(item.get("text"), str):
            texts.append(item["text"])
        elif kind == "image":
            raise ValueError(f"message {index} ({role}), item {j}: images are not supported by this text-only engine")
        else:
            raise ValueError(
                f"message {index} ({role}), item {j}: expected {{'type': 'text', 'text': str}}, got {item!r}"
            )
    return texts


def _turn_text(content: Any, index: int, role: str) -> str:
    """A turn's content as the template writes it: trimmed string, or trimmed items concatenated."""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, Sequence):
        return "".join(t.strip() for t in _text_items(content, index, role))
    raise ValueError(f"message {index} ({role}): content must be a string or a list of text items, "
                     f"got {type(content).__name__}")


def _system_prefix(content: Any) -> str:
    """The first user turn's prefix from a system message: content as is (not trimmed) + "\\n\\n"."""
    if isinstance(content, str):
        return content + "\n\n"
    if isinstance(content, Sequence) and not isinstance(content, str):
        texts = _text_items(content, 0, "system")
        if len(texts) != 1:
            raise ValueError(
                f"message 0 (system): list content must hold exactly one text item (it has {len(texts)}); "
                "the Gemma 3 template keeps only the first"
            )
        return texts[0] + "\n\n"
    raise ValueError(f"message 0 (system): content must be a string or a list of text items, "
                     f"got {type(content).__name__}")


def render_chat(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """Render a conversation with the Gemma 3 chat template (the text starts with "<bos>").

    Args:
        messages: dicts with 'role' ('system' first only, then 'user' / 'assistant' (or 'model')
            alternating from 'user') and 'content' (str or list of text items).
        add_generation_prompt: append "<start_of_turn>model\\n" so the model answers next.
    Returns:
        The prompt text, equal to transformers' `apply_chat_template(messages, tokenize=False)`
        with Google's template.
    Raises:
        ValueError: naming the message index and role that breaks the rules above.
    """
    if isinstance(messages, (str, Mapping)) or not isinstance(messages, Sequence):
        raise ValueError(f"messages must be a list of dicts, got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages is empty: a conversation needs at least one user turn")
    prefix, first = "", 0
    role0, content0 = _message(messages, 0)
    if role0 == "system":
        prefix, first = _system_prefix(content0), 1
        if len(messages) == 1:
            raise ValueError("message 0 (system): a system message needs a user turn after it")
    parts = [BOS]
    for index in range(first, len(messages)):
        role, content = _message(messages, index)
        expected = "user" if (index - first) % 2 == 0 else "assistant"
        if _TURN_ROLES.get(role) != _TURN_ROLES[expected]:
            where = "only allowed as the first message" if role == "system" else f"expected {expected!r}"
            raise ValueError(
                f"message {index}: role {role!r} breaks the Gemma 3 turn order ({where}); roles must be an "
                "optional system message, then user/assistant alternating, starting with user"
            )
        text = (prefix if index == first else "") + _turn_text(content, index, role)
        parts.append(f"{START_OF_TURN}{_TURN_ROLES[role]}\n{text}{END_OF_TURN}\n")
    if add_generation_prompt:
        parts.append(GENERATION_PROMPT)
    return "".join(parts)


def chat_token_ids(
    tokenizer: Tokenizer, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
) -> list[int]:
    """Token ids of the rendered conversation, equal to transformers'
    `apply_chat_template(messages, tokenize=True)`. The template writes "<bos>" itself, so no
    second BOS is added."""
    return tokenizer.encode(render_chat(messages, add_generation_prompt), add_bos=False)
