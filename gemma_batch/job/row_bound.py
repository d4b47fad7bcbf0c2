"""The most tokens a job's rows can take (prompt and completion), so that the KV cache is sized for
the job rather than for --max-batch sequences of the model's whole context (a 5-row job had
reserved 7,119 MiB on the CPU, 28,638 MiB on a GPU). Two bounds:

* `row_bound`, read from the rows before the model loads: a text takes at most one token a UTF-8
  byte, plus the BOS (no piece of the tokenizer is shorter than a byte: byte fallback). A chat
  row's text is its rendered template (which writes the BOS itself). A completion takes at most
  the row's max_tokens, a scored row its longest choice (at most a token a byte, plus one). Rows
  that will fail take nothing. Read only for inputs of at most PRESCAN_ROWS rows: past that, a
  job's run dwarfs the cache's allocation.
* `CountedRows`, the rows' own token counts, counted as the job's requests are made (on the
  read-ahead thread, while the weights load), for inputs small enough to be tokenized by then
  (COUNTED_ROWS rows, COUNTED_BYTES bytes of text): the byte bound is several times too loose for
  most text (a 32-row job of 1,024-token prompts at 4b: 26,656 MiB by bytes, ... by count).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from ..data.rows import InputRow
from ..engine.request import Request
from ..model.chat import render_chat

PRESCAN_ROWS = 20_000
COUNTED_ROWS = 1024  # (at most the runner's read-ahead depth: the thread must get through them unread)
COUNTED_BYTES = 1 << 20  # about 0.5 s of tokenizing on one core

R = TypeVar("R")


@dataclass(frozen=True)
class RowBound:
    rows: int  # rows that may run
    tokens: int  # the most tokens one of them takes: prompt and completion
    text_bytes: int = 0  # their texts' UTF-8 bytes (what tokenizing them costs)
    counted: bool = False  # `tokens` is a count of the rows' tokens (CountedRows), not a bound by bytes

    def countable(self, num_rows: int) -> bool:
        """Whether the job's `num_rows` rows (failing ones too) are few and short enough to count."""
        return num_rows <= COUNTED_ROWS and self.text_bytes <= COUNTED_BYTES


def row_bound(rows: Iterable[InputRow], max_tokens: int, choices: tuple[str, ...]) -> RowBound:
    """The bound over `rows`, the job's `max_tokens` and `choices` applying where a row has none."""
    count = longest = total = 0
    for row in rows:
        if row.error is not None:
            continue
        labels = row.choices or choices
        try:
            text = render_chat(row.messages) if row.messages is not None else row.prompt or ""
            new = max(len(label.encode("utf-8", "surrogatepass")) + 1 for label in labels) if labels else int(
                row.params.get("max_tokens", max_tokens))
        except (ValueError, TypeError, KeyError):  # (the row fails when its request is made)
            continue
        size = len(text.encode("utf-8", "surrogatepass"))
        count, total = count + 1, total + size
        longest = max(longest, size + 1 + new)
    return RowBound(count, longest, total)


class CountedRows:
    """The exact bound of a job's rows, counted from their requests as `count` passes them on (on
    another thread); `bound` waits for the last of them."""

    def __init__(self) -> None:
        self._rows = self._longest = 0
        self._complete = False
        self._ended = threading.Event()

    def count(self, made: Iterable[tuple[InputRow, R]]) -> Iterator[tuple[InputRow, R]]:
        """`made` (rows with their requests, or why they cannot run), counted as they pass."""
        try:
            for row, request in made:
                if isinstance(request, Request):
                    self._rows += 1
                    self._longest = max(self._longest, len(request.prompt_ids) + request.max_new)
                yield row, request
            self._complete = True
        finally:
            self._ended.set()

    def bound(self) -> RowBound | None:
        """The rows' bound once all passed; None if they stopped early (an error: the job raises it
        where that row is read)."""
        self._ended.wait()
        return RowBound(self._rows, self._longest, counted=True) if self._complete else None
