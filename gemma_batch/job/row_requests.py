"""Between dataset rows and engine requests: tokenizing a row, and shaping its output row."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from ..data.rows import InputRow
from ..engine.choices import Choices
from ..engine.constraints import Constraint, Grammars, Matcher
from ..engine.request import Completion, Request
from ..engine.sampling_params import SamplingParams
from ..model.chat import render_chat
from ..model.tokenizer import Tokenizer
from .incremental import request_hash


TOKENIZE_ROWS = 64  # rows tokenized in one call (RowRequests.requests)
TOKENIZE_THREADS = min(8, os.cpu_count() or 1)


@dataclass(frozen=True)
class RowFailure:
    """Why a row cannot run, and its prompt's token count where it was counted."""

    error: str
    prompt_tokens: int | None = None


class RowRequests:
    """Turns valid rows into requests; anything that stops a row becomes a RowFailure."""

    def __init__(
        self, tokenizer: Tokenizer, eos_ids: frozenset[int], params: SamplingParams, max_model_len: int,
        constraint: Constraint | None = None, vocab_size: int = 0, choices: tuple[str, ...] = (),
        score_only: bool = False,
    ) -> None:
        """`constraint` and `choices`: the job's (a row's own overrides them); `vocab_size`: the
        model's, the width of a grammar's mask; `score_only`: every row must have choices."""
        self.tokenizer = tokenizer
        self.stop_ids = frozenset({*eos_ids, Tokenizer.EOS_ID})
        self.params = params
        self.max_model_len = max_model_len
        self.constraint = constraint
        self.vocab_size = vocab_size or tokenizer.vocab_size
        self.choices = choices
        self.score_only = score_only
        self._grammars: dict[frozenset[int], Grammars] = {}  # by stop ids, built when first needed
        if constraint is not None:  # the job's: its grammar view builds on a thread from now (a plain prompt's stops)
            self._grammars[self.stop_ids] = Grammars(tokenizer, self.vocab_size, self.stop_ids)
        self._choices: dict[tuple[str, ...], Choices] = {}  # encoded once: the job's serve every row

    def request(self, row: InputRow) -> Request | RowFailure:
        """The row's request, or why it cannot run."""
        return self._requests([row], 1)[0]

    def requests(self, rows: Iterable[InputRow], settled: Callable[[InputRow], bool] = lambda row: False,
                 ) -> Iterator[tuple[InputRow, Request | RowFailure | None]]:
        """Each of `rows` with its request (or why it cannot run; None for a row `settled` says
        needs none: finished before), in order, their texts tokenized TOKENIZE_ROWS at a time on
        TOKENIZE_THREADS threads: one at a time, tokenizing was what a labelling job of short rows
        waited for (2,000 rows of 290 tokens: 2 s on one thread)."""
        rows = iter(rows)
        while chunk := list(islice(rows, TOKENIZE_ROWS)):
            runs = [row for row in chunk if not settled(row)]
            made = dict(zip((row.index for row in runs), self._requests(runs, TOKENIZE_THREADS)))
            yield from ((row, made.get(row.index)) for row in chunk)

    def _requests(self, rows: list[InputRow], threads: int) -> list[Request | RowFailure]:
        prepared = [self._text(row) for row in rows]
        texts = [p[0] for p in prepared if not isinstance(p, RowFailure)]
        try:
            encoded = iter(self.tokenizer.encode_batch(texts, add_bos=False, threads=threads))
        except Exception:  # noqa: BLE001 - some row's text the tokenizer refuses: each alone, that row fails
            encoded = iter([self._encode(row, p[0]) for row, p in zip(rows, prepared) if not isinstance(p, RowFailure)])
        return [p if isinstance(p, RowFailure) else self._request(row, next(encoded), *p[1:])
                for row, p in zip(rows, prepared)]

    def _text(self, row: InputRow) -> tuple[str, bool, SamplingParams, frozenset[int]] | RowFailure:
        """The text the row's prompt tokenizes from, whether a BOS goes first, its parameters and
        stop ids; or why it cannot run."""
        if row.error is not None:
            return RowFailure(row.error)
        try:
            params = self.params.with_overrides(row.params)
        except (TypeError, ValueError) as e:
            return RowFailure(f"row {row.index}: {e}")
        if row.messages is None:
            return row.prompt or "", True, params, self.stop_ids
        try:  # (the template writes the BOS)
            return render_chat(row.messages), False, params, self.stop_ids | {Tokenizer.END_OF_TURN_ID}
        except (ValueError, TypeError, KeyError) as e:
            return RowFailure(f"row {row.index}: messages: {e}")

    def _encode(self, row: InputRow, text: str) -> list[int] | RowFailure:
        try:
            return self.tokenizer.encode(text, add_bos=False)
        except ValueError as e:
            return RowFailure(f"row {row.index}: {'messages' if row.messages is not None else 'prompt'}: {e}")
        except Exception as e:  # noqa: BLE001 - the tokenizer library's failure on one row fails that row only
            return RowFailure(f"row {row.index}: the tokenizer could not encode this row ({type(e).__name__}: {e})")

    def _request(self, row: InputRow, ids: list[int] | RowFailure, bos: bool, params: SamplingParams,
                 stop: frozenset[int]) -> Request | RowFailure:
        if isinstance(ids, RowFailure):
            return ids
        ids = [Tokenizer.BOS_ID, *ids] if bos else ids
        room = self.max_model_len - len(ids)
        if room < 1:
            return RowFailure(
                f"row {row.index}: prompt is {len(ids)} tokens; the context is {self.max_model_len} tokens "
                f"(--max-model-len), which leaves no room for a completion", len(ids))
        answer = self._answer(row, ids, stop)
        if isinstance(answer, RowFailure):
            return answer
        return Request(row.index, ids, params, stop, params.rng_key(row.id), min(params.max_tokens, room), *answer)

    def _answer(self, row: InputRow, ids: list[int], stop: frozenset[int]) -> tuple[Matcher | None, Choices | None] | RowFailure:
        """The row's grammar matcher or choices (its own, else the job's), or why it cannot have them."""
        own = row.constraint is not None or row.choices is not None
        constraint, labels = (row.constraint, row.choices) if own else (self.constraint, self.choices)
        matcher, choices = None, None
        if self.score_only and not labels:
            return RowFailure(f"row {row.index}: --score-only: the row has no choices (--choices or a `choices` column)",
                              len(ids))
        if labels:
            try:
                choices = self._choices.get(tuple(labels)) or Choices.encode(labels, self.tokenizer)
            except ValueError as e:
                return RowFailure(f"row {row.index}: {e}", len(ids))
            self._choices[tuple(labels)] = choices
            if max(max(label) for label in choices.token_ids) >= self.vocab_size:
                return RowFailure(f"row {row.index}: a choice has a token id past the model's {self.vocab_size} "
                                  "(the tokenizer does not match the model)", len(ids))
            if len(ids) + choices.longest > self.max_model_len:
                return RowFailure(f"row {row.index}: prompt is {len(ids)} tokens and the longest choice {choices.longest}; "
                                  f"the context is {self.max_model_len} tokens (--max-model-len)", len(ids))
        if constraint is not None:
            if stop not in self._grammars:
                self._grammars[stop] = Grammars(self.tokenizer, self.vocab_size, stop)
            try:
                matcher = self._grammars[stop].matcher(constraint)
            except ValueError as e:
                return RowFailure(f"row {row.index}: {e}", len(ids))
        return matcher, choices


def output_row(row: InputRow, request: Request, completion: Completion, score_only: bool = False) -> dict[str, Any]:
    """A finished row of the output (see `data.schema`); with `score_only`, its choices' scores only."""
    p = request.params
    return {
        "row": row.index,
        "id": row.id,
        "request_hash": request_hash(row),
        "completion": None if score_only else completion.text,
        "finish_reason": "scored" if score_only else completion.finish_reason,
        "prompt_tokens": completion.num_prompt_tokens,
        "cached_prompt_tokens": completion.cached_prompt_tokens,
        "completion_tokens": 0 if score_only else len(completion.token_ids),
        "max_tokens": request.max_new_tokens,
        "temperature": p.temperature,
        "top_k": p.top_k,
        "top_p": p.top_p,
        "min_p": p.min_p,
        "seed": p.seed,
        "stop": list(p.stop),
        "choice_logprobs": completion.choice_logprobs,
        "logprobs": completion.logprobs,
        "error": None,
        **row.keep,
        "_kind": row.kind,
    }


def error_row(row: InputRow, failure: RowFailure) -> dict[str, Any]:
    """A row that could not run: its id, its reason, null completion and parameters (its prompt's
    token count where it was counted)."""
    return {
        "row": row.index,
        "id": row.id,
        "request_hash": request_hash(row),
        "completion": None,
        "finish_reason": "error",
        "prompt_tokens": failure.prompt_tokens,
        "cached_prompt_tokens": None,
        "completion_tokens": None,
        "max_tokens": None,
        "temperature": None,
        "top_k": None,
        "top_p": None,
        "min_p": None,
        "seed": None,
        "stop": None,
        "choice_logprobs": None,
        "logprobs": None,
        "error": failure.error,
        **row.keep,
        "_kind": row.kind,
    }
