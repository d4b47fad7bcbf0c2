"""What a dataset reader yields: one `InputRow` per data row, valid or not.

A row that cannot run (a null prompt, a bad parameter, a duplicate id, a line that is not JSON)
still comes out, with `error` saying why, so that it becomes an error row in the output instead of
failing the job. Only file-level problems (`DatasetError`) stop a job, and they are found before
anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..engine.constraints import Constraint

Messages = list[dict[str, Any]]

# Per-row sampling overrides a reader may return in `InputRow.params`, with their Python types.
ROW_PARAMS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "logprobs")
# Per-row answers: a regex or a JSON schema (`InputRow.constraint`; an object or its text), or choices.
CONSTRAINT_COLUMNS = ("regex", "json_schema", "choices")


class DatasetError(Exception):
    """A file-level problem with the input (unreadable, empty, truncated, missing column)."""


class UnknownFormat(DatasetError):
    """The input's name says no format gemma-batch reads (a .txt file), or a .json file holds a
    JSON array instead of JSON Lines."""


class ColumnNotFound(DatasetError):
    """A column the job's flags name (--prompt-column, --id-column, --keep-columns) is not in the
    file: a usage error (the command line, exit 2)."""


@dataclass
class InputRow:
    """One data row of the input, in input order.

    `index` is the 0-based number of the data row (blank JSONL lines are not rows); it is the key
    for resuming and for output order. `id` is the id column's value as a string (integers as
    `str(int)`), the OpenAI `custom_id`, or `str(index)` when the dataset has no id column; None on
    an error row whose id could not be read (a line that is not JSON, a bad id value).
    Exactly one of `prompt` / `messages` is set on a valid row; both are None when `error` is set.
    `params` holds validated overrides (keys from `ROW_PARAMS`): max_tokens int >= 1,
    temperature float >= 0, top_p float in (0, 1], top_k int >= 0 (0 = off), min_p float in [0, 1],
    seed int in [0, 2**63), stop tuple[str, ...] of non-empty strings, logprobs int in [0, 20].
    `constraint` is the row's own `regex` or `json_schema` (None: the job's, if any); `choices` its
    own labels (a list of strings), answered by scoring them (None: the job's, if any).
    `kind` is "chat" for rows rendered with the chat template (and OpenAI /v1/chat/completions
    requests), "text" otherwise.
    """

    index: int
    id: str | None
    prompt: str | None = None
    messages: Messages | None = None
    params: dict[str, Any] = field(default_factory=dict)
    keep: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    kind: Literal["text", "chat"] = "text"
    constraint: Constraint | None = None
    choices: tuple[str, ...] | None = None
