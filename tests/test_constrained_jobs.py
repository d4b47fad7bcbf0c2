"""Constraints through `gemma-batch run`: flags, per-row columns, OpenAI `response_format`, and the
errors a bad grammar gives (a usage error from a flag, an error row from a row)."""

from __future__ import annotations

import json

import jsonschema
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import regex

from tests.test_run_job import gemma_batch, read_rows, write_jsonl

SCHEMA = {"type": "object", "properties": {"tribe": {"enum": ["Judah", "Levi", "Dan"]}, "count": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["tribe", "count"], "additionalProperties": False}


def test_rows_follow_the_jobs_constraint_or_their_own(tmp_path):
    rows = [
        {"id": "plain", "prompt": "And the LORD said unto Moses,"},
        {"id": "own-regex", "prompt": "In the beginning", "regex": "[0-9]{3}-[a-z]{2}"},
        {"id": "schema", "prompt": "The tribes of Israel:", "json_schema": SCHEMA},
        {"id": "schema-text", "prompt": "The tribes of Israel:", "json_schema": json.dumps(SCHEMA)},
        {"id": "bad-regex", "prompt": "Moses went up", "regex": "(("},
        {"id": "bad-schema", "prompt": "Moses went up", "json_schema": {"type": "objekt"}},
        {"id": "both", "prompt": "Moses went up", "regex": "a", "json_schema": SCHEMA},
        {"id": "empty-regex", "prompt": "Moses went up", "regex": ""},
    ]
    src = write_jsonl(tmp_path / "rows.jsonl", rows)
    done = gemma_batch("run", src, "--backend", "cpu", "--regex", "(yes|no|maybe)", "--max-tokens", "48",
                       "--temperature", "0.7", "--seed", "3")
    assert done.returncode == 0, done.stderr
    out = {r["id"]: r for r in read_rows(tmp_path / "rows.jsonl.completions.parquet")}
    assert out["plain"]["completion"] in ("yes", "no", "maybe") and out["plain"]["finish_reason"] == "stop"
    assert regex.fullmatch("[0-9]{3}-[a-z]{2}", out["own-regex"]["completion"])
    for name in ("schema", "schema-text"):
        assert out[name]["finish_reason"] == "stop"
        jsonschema.validate(json.loads(out[name]["completion"]), SCHEMA)
    errors = {name: out[name]["error"] for name in ("bad-regex", "bad-schema", "both", "empty-regex")}
    assert "regex '((' does not compile" in errors["bad-regex"] and "unclosed group" in errors["bad-regex"]
    assert "JSON schema does not compile" in errors["bad-schema"] and "objekt" in errors["bad-schema"]
    assert "has both 'regex' and 'json_schema'" in errors["both"]
    assert "'regex' must be a non-empty string" in errors["empty-regex"]
    assert all(out[name]["finish_reason"] == "error" and out[name]["completion"] is None for name in errors)


def test_a_constrained_row_cut_by_max_tokens_keeps_its_partial_text(tmp_path):
    src = write_jsonl(tmp_path / "long.jsonl", [{"id": "a", "prompt": "In the beginning", "regex": "[a-z]{30}"}])
    done = gemma_batch("run", src, "--backend", "cpu", "--max-tokens", "3")
    assert done.returncode == 0, done.stderr
    row = read_rows(tmp_path / "long.jsonl.completions.parquet")[0]
    assert row["finish_reason"] == "length" and row["completion_tokens"] == 3
    assert row["completion"] and regex.fullmatch("[a-z]{30}", row["completion"], partial=True)


def test_parquet_rows_carry_constraints_as_text_columns(tmp_path):
    table = pa.table({"id": ["a", "b"], "prompt": ["In the beginning", "The tribes of Israel:"],
                      "regex": ["[0-9]{2}", None], "json_schema": [None, json.dumps(SCHEMA)]})
    pq.write_table(table, tmp_path / "in.parquet")
    done = gemma_batch("run", tmp_path / "in.parquet", "--backend", "cpu", "--max-tokens", "40")
    assert done.returncode == 0, done.stderr
    out = {r["id"]: r for r in read_rows(tmp_path / "in.parquet.completions.parquet")}
    assert regex.fullmatch("[0-9]{2}", out["a"]["completion"])
    jsonschema.validate(json.loads(out["b"]["completion"]), SCHEMA)


@pytest.mark.parametrize("flags, message", [
    (("--regex", "(("), "--regex: regex '((' does not compile"),
    (("--regex", "a", "--json"), "--regex and --json: give one constraint"),
    (("--json-schema", "missing.json"), "--json-schema missing.json: cannot read it"),
    (("--choices", "yes"), "give at least two different, non-empty labels"),
    (("--choices", "yes,no", "--json"), "--json and --choices: give one constraint"),
    (("--score-only", "--regex", "a"), "--score-only scores choices; --regex constrains generated text"),
    (("--choices", "yes,no", "--score-only", "--output-format", "openai"), "OpenAI result lines do not have"),
])
def test_bad_constraint_and_choices_flags_are_usage_errors(tmp_path, flags, message):
    src = write_jsonl(tmp_path / "rows.jsonl", [{"id": "a", "prompt": "In the beginning"}])
    done = gemma_batch("run", src, *flags, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "rows.jsonl.completions.parquet").exists()


def test_a_schema_file_constrains_every_row_and_is_part_of_the_job(tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    src = write_jsonl(tmp_path / "rows.jsonl", [{"id": f"r{i}", "prompt": f"Tribe number {i}:"} for i in range(4)])
    done = gemma_batch("run", src, "--backend", "cpu", "--json-schema", schema, "--max-tokens", "40")
    assert done.returncode == 0, done.stderr
    for row in read_rows(tmp_path / "rows.jsonl.completions.parquet"):
        jsonschema.validate(json.loads(row["completion"]), SCHEMA)
    other = gemma_batch("run", src, "--backend", "cpu", "--json", "--max-tokens", "40")
    assert other.returncode == 2 and "params.constraint" in other.stderr  # another constraint: another job


def test_openai_response_format_constrains_the_row(tmp_path):
    def line(custom_id: str, response_format) -> dict:
        return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
                "body": {"prompt": "The tribes of Israel:", "max_tokens": 40, "response_format": response_format}}

    src = write_jsonl(tmp_path / "batch.jsonl", [
        line("object", {"type": "json_object"}),
        line("schema", {"type": "json_schema", "json_schema": {"name": "tribe", "schema": SCHEMA, "strict": True}}),
        line("text", {"type": "text"}),
        line("bad", {"type": "yaml"}),
    ])
    done = gemma_batch("run", src, "--backend", "cpu", "--output-format", "openai")
    assert done.returncode == 0, done.stderr
    results = {r["custom_id"]: r for r in map(json.loads, (tmp_path / "batch.jsonl.results.jsonl").read_text().splitlines())}
    choice = {k: r["response"]["body"]["choices"][0] for k, r in results.items() if r["error"] is None}
    text = {k: c["text"] for k, c in choice.items()}
    assert text["object"].startswith("{")  # (the demo model may write a key until --max-tokens)
    if choice["object"]["finish_reason"] == "stop":
        assert isinstance(json.loads(text["object"]), dict)
    assert choice["schema"]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(text["schema"]), SCHEMA)
    assert "text" in text and "bad" not in text
    assert "response_format must have type" in results["bad"]["error"]["message"]


def test_choices_answer_every_row_with_label_probabilities(tmp_path):
    rows = [
        {"id": "flag", "prompt": "And the LORD spake unto"},
        {"id": "own", "prompt": "Then said", "choices": [" Moses", " the children of Israel"]},
        {"id": "one", "prompt": "Then said", "choices": [" Moses"]},
        {"id": "both", "prompt": "Then said", "choices": [" Moses", " Aaron"], "regex": "a"},
    ]
    src = write_jsonl(tmp_path / "rows.jsonl", rows)
    done = gemma_batch("run", src, "--backend", "cpu", "--choices", " Moses, Aaron,Pharaoh")
    assert done.returncode == 0, done.stderr
    out = {r["id"]: r for r in read_rows(tmp_path / "rows.jsonl.completions.parquet")}
    for name, labels in (("flag", ["Moses", "Aaron", "Pharaoh"]), ("own", [" Moses", " the children of Israel"])):
        scored = out[name]["choice_logprobs"]
        assert [c["choice"] for c in scored] == labels  # (the flag's labels are stripped at the commas)
        assert abs(sum(c["probability"] for c in scored) - 1) < 1e-9
        best = max(scored, key=lambda c: c["logprob"])
        assert out[name]["completion"] == best["choice"] and out[name]["finish_reason"] == "stop"
    assert "at least two different labels" in out["one"]["error"]
    assert "has both 'choices' and a 'regex'" in out["both"]["error"]
    assert out["one"]["choice_logprobs"] is None


def test_score_only_writes_the_probabilities_and_no_answer(tmp_path):
    """--score-only: the same label probabilities as a choices job, no completion, and rows without
    choices fail (here the job has none: only the rows' columns give them)."""
    rows = [
        {"id": "a", "prompt": "And the LORD spake unto", "choices": [" Moses", " Aaron", " Pharaoh"]},
        {"id": "b", "prompt": "Then said", "choices": [" Moses", " the children of Israel"]},
        {"id": "none", "prompt": "Then said"},
    ]
    src = write_jsonl(tmp_path / "rows.jsonl", rows)
    answered = gemma_batch("run", src, "--backend", "cpu", "--temperature", "0.8", "--output", tmp_path / "answered.parquet")
    scored = gemma_batch("run", src, "--backend", "cpu", "--temperature", "0.8", "--score-only",
                         "--output", tmp_path / "scored.parquet")
    assert answered.returncode == 0 and scored.returncode == 0, scored.stderr
    full = {r["id"]: r for r in read_rows(tmp_path / "answered.parquet")}
    out = {r["id"]: r for r in read_rows(tmp_path / "scored.parquet")}
    for name in ("a", "b"):
        assert out[name]["completion"] is None and out[name]["finish_reason"] == "scored"
        assert out[name]["completion_tokens"] == 0 and out[name]["error"] is None
        assert out[name]["choice_logprobs"] == full[name]["choice_logprobs"]
    assert full["none"]["completion"] and full["none"]["finish_reason"] in ("stop", "length")
    assert out["none"]["finish_reason"] == "error" and "--score-only: the row has no choices" in out["none"]["error"]
    again = gemma_batch("run", src, "--backend", "cpu", "--temperature", "0.8", "--output", tmp_path / "scored.parquet")
    assert again.returncode == 2 and "score_only" in again.stderr  # a different job: it is part of the fingerprint
