"""The most tokens a job's rows can take (prompt and completion), read from the rows before the
model loads, so that the KV cache is sized for the job rather than for --max-batch sequences of
the model's whole context (a 5-row job had reserved 7,119 MiB on the CPU, 28,638 MiB on a GPU).

A text takes at most one token a UTF-8 byte, plus the BOS: no piece of the tokenizer is shorter
than a byte (byte fallback: a piece a byte). A chat row's text is its rendered template (which
writes the BOS itself). A completion takes at most the row's max_tokens, a scored row its
longest choice (at most a token a byte, plus one). Rows that will fail take nothing. Read only
for inputs of at most PRESCAN_ROWS rows: past that, a job's run dwarfs the cache's allocation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..data.rows import InputRow
from ..model.chat import render_chat

PRESCAN_ROWS = 20_000


@dataclass(frozen=True)
class RowBound:
    rows: int  # rows that may run
    tokens: int  # the most tokens one of them takes: prompt and completion


def row_bound(rows: Iterable[InputRow], max_tokens: int, choices: tuple[str, ...]) -> RowBound:
    """The bound over `rows`, the job's `max_tokens` and `choices` applying where a row has none."""
    count = longest = 0
    for row in rows:
        if row.error is not None:
            continue
        try:
            text = render_chat(row.messages) if row.messages is not None else row.prompt or ""
        except (ValueError, TypeError, KeyError):  # (the row fails when its request is made)
            continue
        labels = row.choices or choices
        new = max(len(label.encode("utf-8", "surrogatepass")) + 1 for label in labels) if labels else int(
            row.params.get("max_tokens", max_tokens))
        count += 1
        longest = max(longest, len(text.encode("utf-8", "surrogatepass")) + 1 + new)
    return RowBound(count, longest)
