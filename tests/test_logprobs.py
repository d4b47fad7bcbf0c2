"""Token log-probabilities (`--logprobs K`) on the demo model: each equals a full-vocabulary
log-softmax of the CPU backend's logits from a full forward pass (after a grammar's mask, which the
reference applies from the `regex` module's partial matches), with the K most likely alternatives;
and they reach the Parquet column and OpenAI result lines in OpenAI's shape."""

from __future__ import annotations

import json

import numpy as np
import pytest
import regex

from gemma_batch.backends.sampler import log_softmax
from gemma_batch.engine.constraints import Constraint, Grammars
from gemma_batch.engine.request import Request
from gemma_batch.engine.sampling_params import SamplingParams
from gemma_batch.engine.score import token_logits
from gemma_batch.model.tokenizer import Tokenizer
from tests.demo_engine import demo_cpu, run_engine
from tests.test_run_job import gemma_batch, read_rows, write_jsonl

STOP = frozenset({Tokenizer.EOS_ID, Tokenizer.END_OF_TURN_ID})


@pytest.fixture(scope="module")
def model():
    return demo_cpu()


@pytest.mark.parametrize("pattern", [None, "[a-z ]{4,30}"])
def test_logprobs_equal_a_full_log_softmax_of_the_cpu_logits(model, pattern):
    backend, tokenizer = model
    grammars = Grammars(tokenizer, backend.cfg.vocab_size, STOP)
    prompts = ["And the LORD said", "In the beginning", "Then Moses"]
    requests = []
    for i, prompt in enumerate(prompts):
        params = SamplingParams(max_tokens=8, temperature=[0.0, 0.9, 1.3][i], seed=2, logprobs=[0, 3, 20][i])
        matcher = grammars.matcher(Constraint("regex", pattern)) if pattern else None
        requests.append(Request(i, tokenizer.encode(prompt), params, STOP, params.rng_key(f"r{i}"), 8, matcher))
    got = run_engine(backend, tokenizer, requests)[0]
    pieces = [tokenizer.piece_bytes(t) for t in range(tokenizer.vocab_size)]
    special = set(tokenizer.added_ids)
    for r in requests:
        c = got[r.request_id]
        assert len(c.logprobs) == len(c.token_ids) > 0
        logits = token_logits(backend, [r.prompt_ids + c.token_ids])[0][len(r.prompt_ids) - 1:, : tokenizer.vocab_size]
        text = b""
        for j, (token, entry) in enumerate(zip(c.token_ids, c.logprobs)):
            row = logits[j].copy()
            if pattern:  # the reference mask: ids whose bytes keep a partial match (a stop token once it matches)
                whole = bool(regex.fullmatch(pattern.encode(), text))
                ok = [(t in STOP and whole) or bool(t not in special and pieces[t]
                                                    and regex.fullmatch(pattern.encode(), text + pieces[t], partial=True))
                      for t in range(len(row))]
                row[~np.array(ok)] = -np.inf
            ref = log_softmax(row)
            assert entry["token_id"] == token and abs(entry["logprob"] - ref[token]) <= 1e-5
            k = r.params.logprobs
            want = np.lexsort((np.arange(len(ref)), -ref))[:k]
            assert [a["token_id"] for a in entry["top_logprobs"]] == want.tolist()
            np.testing.assert_allclose([a["logprob"] for a in entry["top_logprobs"]], ref[want], rtol=0, atol=1e-5)
            text += pieces[token]


def test_logprobs_reach_the_parquet_column_and_openai_lines(tmp_path):
    src = write_jsonl(tmp_path / "rows.jsonl", [{"id": "a", "prompt": "And the LORD said"},
                                               {"id": "b", "prompt": "And the LORD said", "logprobs": 1}])
    done = gemma_batch("run", src, "--backend", "cpu", "--max-tokens", "4", "--logprobs", "2")
    assert done.returncode == 0, done.stderr
    rows = {r["id"]: r for r in read_rows(tmp_path / "rows.jsonl.completions.parquet")}
    assert [len(t["top_logprobs"]) for t in rows["a"]["logprobs"]] == [2] * rows["a"]["completion_tokens"]
    assert [len(t["top_logprobs"]) for t in rows["b"]["logprobs"]] == [1] * rows["b"]["completion_tokens"]
    assert "".join(t["token"] for t in rows["a"]["logprobs"]) == rows["a"]["completion"]

    def line(custom_id: str, url: str, body: dict) -> dict:
        return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"max_tokens": 3, **body}}

    batch = write_jsonl(tmp_path / "batch.jsonl", [
        line("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 2}),
        line("text", "/v1/completions", {"prompt": "And the LORD said", "logprobs": 2}),
        line("none", "/v1/completions", {"prompt": "And the LORD said"}),
        line("bad", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 2}),
    ])
    done = gemma_batch("run", batch, "--backend", "cpu", "--output-format", "openai")
    assert done.returncode == 0, done.stderr
    results = {r["custom_id"]: r for r in map(json.loads, (tmp_path / "batch.jsonl.results.jsonl").read_text().splitlines())}
    chat = results["chat"]["response"]["body"]["choices"][0]["logprobs"]["content"]
    assert len(chat) == 3 and all(len(t["top_logprobs"]) == 2 and t["bytes"] == list(t["token"].encode()) for t in chat)
    text = results["text"]["response"]["body"]["choices"][0]["logprobs"]
    assert len(text["tokens"]) == len(text["token_logprobs"]) == len(text["top_logprobs"]) == 3
    assert text["text_offset"][0] == 0 and all(len(alts) <= 2 for alts in text["top_logprobs"])
    assert results["none"]["response"]["body"]["choices"][0]["logprobs"] is None
    assert "top_logprobs needs logprobs: true" in results["bad"]["error"]["message"]
