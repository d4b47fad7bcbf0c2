"""OpenAI Batch API input lines as rows.

Each line is `{"custom_id": str, "method": "POST", "url": URL, "body": {...}}` with URL
"/v1/chat/completions" (body `messages`, a chat row) or "/v1/completions" (body `prompt`, a text row,
never wrapped in the chat template). The id is `custom_id`. Body sampling fields become the row's
params; `response_format` (json_object, json_schema) its constraint; fields that change nothing
here are ignored, anything else makes the row an error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .row_checks import (
    RowError,
    RowSpec,
    chat_allowed,
    check_id,
    check_messages,
    check_param,
    check_text,
    error_row,
    register_id,
    show,
)
from ..engine.constraints import Constraint
from .rows import ROW_PARAMS, InputRow
from .seen_ids import SeenIds

OPENAI_KEYS = frozenset({"custom_id", "method", "url", "body"})
CHAT_URL, COMPLETIONS_URL = "/v1/chat/completions", "/v1/completions"

# Body fields ignored always, and those ignored only when null or at their no-op value.
IGNORED_FIELDS = frozenset({"model", "user", "metadata", "store"})
NO_OP_VALUES: dict[str, Any] = {
    "stream": False, "frequency_penalty": 0, "presence_penalty": 0, "n": 1,
}  # fmt: skip


def _is_no_op(name: str, value: Any) -> bool:
    """Whether a NO_OP_VALUES field's value changes nothing (bools and numbers never match each other)."""
    want = NO_OP_VALUES[name]
    return value is None or (isinstance(value, bool) == isinstance(want, bool) and value == want)


def _body_params(body: Mapping[str, Any], chat: bool) -> dict[str, Any]:
    """The validated sampling params of a body (`max_completion_tokens` is `max_tokens`; a chat
    body's `logprobs: true` and `top_logprobs: K`, a completions body's `logprobs: K`, are `logprobs`)."""
    params: dict[str, Any] = {}
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise RowError("body has both 'max_tokens' and 'max_completion_tokens': give one")
    if body.get("max_completion_tokens") is not None:
        params["max_tokens"] = check_param("max_tokens", body["max_completion_tokens"], "max_completion_tokens")
    for name in ROW_PARAMS:
        if name != "logprobs" and body.get(name) is not None:
            params[name] = check_param(name, body[name])
    wanted, top = body.get("logprobs"), body.get("top_logprobs")
    if chat and wanted is not None and not isinstance(wanted, bool):
        raise RowError(f"body logprobs must be true or false in a chat request, got {show(wanted)}")
    if chat and top is not None and wanted is not True:
        raise RowError("body top_logprobs needs logprobs: true")
    if chat and wanted is True:
        params["logprobs"] = check_param("logprobs", 0 if top is None else top, "top_logprobs")
    elif not chat and wanted is not None:  # /v1/completions: logprobs is the count of alternatives
        params["logprobs"] = check_param("logprobs", wanted)
    return params


def _response_format(value: Any) -> Constraint | None:
    """The constraint of a body's `response_format`: {"type": "text"} none, {"type": "json_object"}
    any JSON object, {"type": "json_schema", "json_schema": {"schema": {...}, ...}} that schema."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json")
    if kind == "json_schema":
        schema = value.get("json_schema")
        if not isinstance(schema, dict) or not isinstance(schema.get("schema"), dict):
            raise RowError(f"body response_format json_schema must hold a 'schema' object, got {show(schema)}")
        try:
            return Constraint.json_schema(schema["schema"])
        except ValueError as e:
            raise RowError(f"body response_format: {e}") from None
    raise RowError(f"body response_format must have type 'text', 'json_object' or 'json_schema', got {show(value)}")


def _check_fields(body: Mapping[str, Any], prompt_field: str) -> None:
    """Raise naming every body field this engine does not support."""
    known = {prompt_field, "max_completion_tokens", "response_format", "top_logprobs", *ROW_PARAMS, *IGNORED_FIELDS}
    problems = []
    for name, value in body.items():
        if name in NO_OP_VALUES:
            if not _is_no_op(name, value):
                only = json.dumps(NO_OP_VALUES[name])
                problems.append(f"body field {name!r} = {show(value)} is not supported (only {only})")
        elif name not in known:
            problems.append(f"body field {name!r} is not supported")
    if problems:
        raise RowError("; ".join(problems))


def _request(record: Mapping[str, Any], chat: bool | None) -> InputRow:
    """A request's prompt and params as a row (index, id and keep are set by the caller)."""
    if record.get("method") != "POST":
        raise RowError(f"method must be 'POST', got {show(record.get('method'))}")
    url = record.get("url")
    if url not in (CHAT_URL, COMPLETIONS_URL):
        raise RowError(f"url must be {CHAT_URL!r} or {COMPLETIONS_URL!r}, got {show(url)}")
    body = record.get("body")
    if not isinstance(body, dict):
        raise RowError("body is missing" if body is None else f"body must be an object, got {show(body)}")
    row = InputRow(index=0, id="")
    if url == CHAT_URL:
        _check_fields(body, "messages")
        if body.get("messages") is None:
            raise RowError(f"body has no 'messages' (required by {CHAT_URL})")
        chat_allowed(chat)
        row.messages, row.kind = check_messages(body["messages"], "body messages"), "chat"
    else:
        _check_fields(body, "prompt")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        elif isinstance(prompt, list):
            raise RowError(f"body prompt must be a string (or a list of one string), got a list of {len(prompt)}")
        row.prompt = check_text(prompt, "body prompt")
    row.params = _body_params(body, url == CHAT_URL)
    if body.get("response_format") is not None:
        row.constraint = _response_format(body["response_format"])
    return row


def openai_row(index: int, where: str, record: Mapping[str, Any], spec: RowSpec, seen: SeenIds) -> InputRow:
    """One OpenAI Batch request line as an InputRow; problems become the row's `error`."""
    keep = spec.keep(record)
    row_id = None  # (a custom_id that cannot be read: null, never a row number that may be another's)
    try:
        row_id = check_id(record, "custom_id", allow_int=False)
        register_id(row_id, index, seen)
        row = _request(record, spec.chat)
    except RowError as e:
        return error_row(index, where, str(e), row_id, keep)
    row.index, row.id, row.keep = index, row_id, keep
    return row
