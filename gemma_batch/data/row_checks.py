"""Row-level validation shared by the readers: ids, prompts, chat messages, sampling overrides.

Each `check_*` function returns the validated value or raises `RowError` with a message that does
not name the row; `make_row` turns one record (a JSON object, or one Parquet row as a dict) into an
`InputRow`, prefixing any error with where the row is ("row 17 (line 18): prompt is null").
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..engine.constraints import Constraint
from .rows import ROW_PARAMS, InputRow, Messages
from .seen_ids import SeenIds

MAX_STOP_STRINGS = 16
TEXT_ITEM = "{'type': 'text', 'text': str}"

# Numeric overrides: (integer?, range check, what the error says the value must be).
_NUMBER_RULES: dict[str, tuple[bool, Callable[[float], bool], str]] = {
    "max_tokens": (True, lambda v: v >= 1, "an integer >= 1"),
    "temperature": (False, lambda v: v >= 0, "a number >= 0"),
    "top_p": (False, lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "top_k": (True, lambda v: v >= 0, "an integer >= 0"),
    "min_p": (False, lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "seed": (True, lambda v: 0 <= v < 2**63, "an integer in [0, 2**63)"),
    "logprobs": (True, lambda v: 0 <= v <= 20, "an integer in [0, 20]"),
}


class RowError(ValueError):
    """Why one row cannot run; the message does not name the row."""


def show(value: Any, limit: int = 60) -> str:
    """A value's repr for an error message, cut to about `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_id(record: Mapping[str, Any], column: str, allow_int: bool = True) -> str:
    """The row id from `record[column]`: a non-empty string, or an int (not bool) as `str(int)`."""
    if column not in record:
        raise RowError(f"id column {column!r} is missing")
    value = record[column]
    if value is None:
        raise RowError(f"id {column!r} is null")
    if allow_int and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        wanted = "a string or an integer" if allow_int else "a string"
        raise RowError(f"id {column!r} must be {wanted}, got {show(value)}")
    if not value:
        raise RowError(f"id {column!r} is empty")
    return value


def check_text(value: Any, label: str) -> str:
    """A prompt: a string that is not empty or whitespace only."""
    if value is None:
        raise RowError(f"{label} is null")
    if not isinstance(value, str):
        raise RowError(f"{label} must be a string, got {show(value)}")
    if not value.strip():
        raise RowError(f"{label} is {'empty' if not value else 'whitespace only'}")
    return value


def check_messages(value: Any, label: str = "messages") -> Messages:
    """A shallow check of a chat conversation: a non-empty list of objects, each with a string
    `role` and a `content` that is a string or a list of text items. Roles, turn order and the
    rest are checked later by the chat template renderer."""
    if not isinstance(value, list) or not value:
        raise RowError(f"{label} must be a non-empty list of {{'role', 'content'}} objects, got {show(value)}")
    for i, msg in enumerate(value):
        if not isinstance(msg, dict):
            raise RowError(f"{label}[{i}] must be an object with 'role' and 'content', got {show(msg)}")
        if not isinstance(msg.get("role"), str):
            raise RowError(f"{label}[{i}]: 'role' must be a string, got {show(msg.get('role'))}")
        content = msg.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list) or not all(
            isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str)
            for item in content
        ):
            raise RowError(
                f"{label}[{i}]: 'content' must be a string or a list of {TEXT_ITEM} items, got {show(content)}"
            )
    return value


def chat_allowed(chat: bool | None) -> None:
    """Raise when chat messages are turned off (chat=False)."""
    if chat is False:
        raise RowError("'messages' need the chat template, which --no-chat turns off (drop --no-chat)")


def check_prompt(
    record: Mapping[str, Any], prompt_column: str, chat: bool | None
) -> tuple[str | None, Messages | None, Literal["text", "chat"]]:
    """(prompt, messages, kind) of a row holding either `prompt_column` or `messages`."""
    label = "prompt" if prompt_column == "prompt" else f"prompt column {prompt_column!r}"
    prompt, messages = record.get(prompt_column), record.get("messages")
    if prompt_column not in record and "messages" not in record:
        raise RowError(f"missing {label} (and no 'messages')")
    if prompt is not None and messages is not None:
        raise RowError(f"has both {label} and 'messages': give one")
    if messages is not None:
        chat_allowed(chat)
        return None, check_messages(messages), "chat"
    if prompt_column not in record:
        raise RowError("messages is null")
    text = check_text(prompt, label)
    if chat:
        return None, [{"role": "user", "content": text}], "chat"
    return text, None, "text"


def check_param(name: str, value: Any, label: str | None = None) -> Any:
    """One sampling override (`name` from ROW_PARAMS), validated and converted; `label` is the
    name the error message uses (defaults to `name`)."""
    label = repr(label or name)
    if name == "stop":
        stops = [value] if isinstance(value, str) else value
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise RowError(f"{label} must be a string or a list of strings, got {show(value)}")
        if len(stops) > MAX_STOP_STRINGS:
            raise RowError(f"{label} has {len(stops)} strings; at most {MAX_STOP_STRINGS} are allowed")
        if not all(stops):
            raise RowError(f"{label} strings must not be empty")
        return tuple(stops)
    integer, in_range, wanted = _NUMBER_RULES[name]
    bad = RowError(f"{label} must be {wanted}, got {show(value)}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad
    if isinstance(value, float):
        if not math.isfinite(value) or (integer and not value.is_integer()):
            raise bad
        value = int(value) if integer else value
    elif not integer:
        value = float(value)
    if not in_range(value):
        raise bad
    return value


def check_params(record: Mapping[str, Any]) -> dict[str, Any]:
    """The non-null sampling overrides among `record`'s keys, validated."""
    return {name: check_param(name, record[name]) for name in ROW_PARAMS if record.get(name) is not None}


def check_constraint(record: Mapping[str, Any], label: str = "") -> Constraint | None:
    """The row's own constraint: a non-empty `regex` string or a `json_schema` (an object or its
    JSON text), not both; None when neither is given. Whether it compiles is checked later, with
    the tokenizer."""
    regex, schema = record.get("regex"), record.get("json_schema")
    if regex is not None and schema is not None:
        raise RowError(f"has both {label}'regex' and {label}'json_schema': give one")
    if regex is not None:
        if not isinstance(regex, str) or not regex:
            raise RowError(f"{label}'regex' must be a non-empty string, got {show(regex)}")
        return Constraint("regex", regex)
    if schema is not None:
        try:
            return Constraint.json_schema(schema)
        except ValueError as e:
            raise RowError(f"{label}'json_schema': {e}") from None
    return None


def check_choices(value: Any) -> tuple[str, ...] | None:
    """A row's `choices`: a list of at least two distinct non-empty strings (None when null)."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise RowError(f"'choices' must be a list of non-empty strings, got {show(value)}")
    if len(value) < 2 or len(set(value)) < len(value):
        raise RowError(f"'choices' must hold at least two different labels, got {show(value)}")
    return tuple(value)


def keep_text(value: Any) -> str | None:
    """A kept JSON value as a string column: strings as they are, null as None, else JSON text."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


@dataclass(frozen=True)
class RowSpec:
    """How to read records into rows: which keys hold what, and how kept values are stored."""

    prompt_column: str
    id_column: str | None  # None: ids are row numbers
    keep_columns: tuple[str, ...]
    chat: bool | None
    keep_value: Callable[[Any], Any]  # identity for Parquet, keep_text for JSON formats

    def keep(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """The kept values of a record (None where a key is missing)."""
        return {name: self.keep_value(record.get(name)) for name in self.keep_columns}


def register_id(row_id: str, index: int, seen: SeenIds) -> None:
    """Record a row's id; raise if an earlier row had it."""
    first = seen.add(row_id, index)
    if first is not None:
        raise RowError(f"duplicate id {row_id!r} (first seen at row {first})")


def make_row(index: int, where: str, record: Mapping[str, Any], spec: RowSpec, seen: SeenIds) -> InputRow:
    """One record as an InputRow; a problem becomes the row's `error`, prefixed with `where`."""
    row = InputRow(index=index, id=unknown_id(index, spec), keep=spec.keep(record))
    try:
        if spec.id_column is not None:
            row.id = check_id(record, spec.id_column)
            register_id(row.id, index, seen)
        row.prompt, row.messages, row.kind = check_prompt(record, spec.prompt_column, spec.chat)
        row.params = check_params(record)
        row.constraint = check_constraint(record)
        row.choices = check_choices(record.get("choices"))
        if row.choices is not None and row.constraint is not None:
            raise RowError("has both 'choices' and a 'regex' or 'json_schema': give one")
    except RowError as e:
        return error_row(index, where, str(e), row.id, row.keep)
    return row


def unknown_id(index: int, spec: RowSpec) -> str | None:
    """The id of row `index` before (or without) its id column is read: None where the dataset
    has an id column (a row number there could equal another row's id), else the row number."""
    return None if spec.id_column is not None else str(index)


def error_row(index: int, where: str, message: str, row_id: str | None, keep: dict[str, Any]) -> InputRow:
    """An error row: no prompt, messages or params, `error` = "{where}: {message}"."""
    return InputRow(index=index, id=row_id, keep=keep, error=f"{where}: {message}")
