"""Rows into requests many at a time (RowRequests.requests: the texts tokenized in one call on
several threads) give what one at a time gives, failures included; and the rows' exact bound,
counted as they pass (row_bound.CountedRows), is what their requests take."""

from __future__ import annotations

import pytest

from gemma_batch.data.rows import InputRow
from gemma_batch.engine.request import Request
from gemma_batch.engine.sampling_params import SamplingParams
from gemma_batch.job.row_bound import CountedRows, row_bound
from gemma_batch.job.row_requests import TOKENIZE_ROWS, RowFailure, RowRequests
from gemma_batch.job.spec import DEMO_MODEL
from gemma_batch.model.tokenizer import Tokenizer


def _rows() -> list[InputRow]:
    """Prompts plain and with special pieces, chat rows good and bad, failing parameters, a text
    SentencePiece refuses (a lone surrogate), one too long for the context, and choices; more of
    them than one tokenizing call takes."""
    kinds = [
        dict(prompt="hello there, general"),
        dict(prompt="<start_of_turn>user\nwho?<end_of_turn>\n<start_of_turn>model\n"),
        dict(prompt=""),
        dict(messages=[{"role": "user", "content": "hi <start_of_turn> there"}]),
        dict(messages=[{"role": "assistant", "content": "starts wrong"}]),
        dict(prompt="fine", params={"max_tokens": "many"}),
        dict(prompt="bad \ud800 text"),
        dict(prompt="word " * 300),
        dict(prompt="pick one", choices=("yes", "no")),
        dict(error="not JSON"),
    ]
    return [InputRow(i, f"r{i}", **kinds[i % len(kinds)]) for i in range(TOKENIZE_ROWS + 23)]


def _requests() -> RowRequests:
    tok = Tokenizer.from_dir(DEMO_MODEL)
    return RowRequests(tok, frozenset({1}), SamplingParams(max_tokens=16), max_model_len=200)


def test_many_at_a_time_as_one_at_a_time():
    requests = _requests()
    rows = _rows()
    together = list(requests.requests(rows))
    assert [row for row, _ in together] == rows
    for row, made in together:
        assert made == requests.request(row), row
    assert isinstance(together[0][1], Request) and together[0][1].prompt_ids[0] == Tokenizer.BOS_ID
    assert together[3][1].prompt_ids.count(Tokenizer.BOS_ID) == 1  # (the template's own)
    assert together[1][1].prompt_ids[1] == Tokenizer.START_OF_TURN_ID
    failed = {row.index % 10: made.error for row, made in together[:10] if isinstance(made, RowFailure)}
    assert set(failed) == {4, 5, 6, 7, 9}, failed
    assert "messages" in failed[4] and "prompt" in failed[6] and "no room" in failed[7]


def test_the_counted_bound_is_the_longest_request_and_none_when_cut_short():
    requests = _requests()
    rows = _rows()
    counted = CountedRows()
    made = list(counted.count(requests.requests(rows)))
    runnable = [r for _, r in made if isinstance(r, Request)]
    bound = counted.bound()
    assert bound.counted and bound.rows == len(runnable)
    assert bound.tokens == max(len(r.prompt_ids) + r.max_new for r in runnable)
    assert bound.tokens <= row_bound(rows, 16, ()).tokens  # (the bound by bytes holds too)

    def failing():
        yield from made[:3]
        raise OSError("the input went away")

    cut = CountedRows()
    with pytest.raises(OSError):
        list(cut.count(failing()))
    assert cut.bound() is None


def test_rows_settled_before_the_run_are_not_tokenized():
    """A resumed or incremental job's finished rows need no request: none is made for them (the
    tokenizer never sees their texts), and the others' are as before."""
    requests = _requests()
    rows = [InputRow(i, f"r{i}", prompt=f"prompt number {i}") for i in range(TOKENIZE_ROWS + 23)]
    seen: list[str] = []
    encode_batch = requests.tokenizer.encode_batch
    requests.tokenizer.encode_batch = lambda texts, **kw: (seen.extend(texts), encode_batch(texts, **kw))[1]
    made = list(requests.requests(rows, settled=lambda row: row.index % 3 == 0))
    assert sorted(seen) == sorted(row.prompt for row in rows if row.index % 3)
    assert [row for row, _ in made] == rows
    for row, request in made:
        assert request is None if row.index % 3 == 0 else request == requests.request(row), row
