"""The dataset readers: file-level errors, row-level errors, ids, overrides, keep columns, formats."""

from __future__ import annotations

import hashlib
import json
import io
import os
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gemma_batch.data.readers import Dataset, open_dataset
from gemma_batch.data.rows import ColumnNotFound, DatasetError, InputRow, UnknownFormat
from gemma_batch.data.seen_ids import SeenIds, id_hash

# --- helpers -------------------------------------------------------------------------------


def write_jsonl(tmp_path: Path, lines: list[Any], name: str = "in.jsonl", end: str = "\n") -> Path:
    """Lines as given (str) or as JSON (anything else), each ended by "\\n" except the last (`end`)."""
    texts = [line if isinstance(line, str) else json.dumps(line) for line in lines]
    path = tmp_path / name
    path.write_text("\n".join(texts) + end, encoding="utf-8")
    return path


def write_parquet(tmp_path: Path, table: pa.Table | dict[str, list], name: str = "in.parquet", **kw: Any) -> Path:
    path = tmp_path / name
    pq.write_table(table if isinstance(table, pa.Table) else pa.table(table), path, **kw)
    return path


def read_all(path: Path, **kw: Any) -> list[InputRow]:
    return list(open_dataset(path, **kw).rows())


def one_row(tmp_path: Path, record: Any, **kw: Any) -> InputRow:
    """The only row of a one-line JSONL file holding `record`."""
    (row,) = read_all(write_jsonl(tmp_path, [record]), **kw)
    return row


def dataset_error(path: Path, **kw: Any) -> str:
    with pytest.raises(DatasetError) as e:
        open_dataset(path, **kw)
    assert str(path) in str(e.value)
    return str(e.value)


def assert_error(row: InputRow, *fragments: str) -> None:
    assert row.error is not None, row
    for fragment in fragments:
        assert fragment in row.error, row.error
    assert row.prompt is None and row.messages is None and row.params == {}


# --- format detection, counting, fingerprint -----------------------------------------------


@pytest.mark.parametrize("name", ["in.jsonl", "in.json", "in.ndjson", "in.JSONL"])
def test_jsonl_suffixes_and_sniffing(tmp_path: Path, name: str) -> None:
    path = write_jsonl(tmp_path, [{"prompt": "a"}, "", "   ", {"prompt": "b"}, ""], name=name)
    ds = open_dataset(path)
    assert isinstance(ds, Dataset) and ds.format == "jsonl" and ds.path == path
    assert ds.num_rows == 2  # blank lines are not rows
    assert ds.fingerprint == hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()
    rows = list(ds.rows())
    assert [(r.index, r.id, r.prompt, r.kind) for r in rows] == [(0, "0", "a", "text"), (1, "1", "b", "text")]


def test_parquet_by_suffix_and_by_magic(tmp_path: Path) -> None:
    for name in ("in.parquet", "in.data"):
        path = write_parquet(tmp_path, {"prompt": ["a", "b", "c"]}, name=name)
        ds = open_dataset(path)
        assert ds.format == "parquet" and ds.num_rows == 3
        assert ds.fingerprint == hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()
        assert [(r.index, r.id, r.prompt) for r in ds.rows()] == [(0, "0", "a"), (1, "1", "b"), (2, "2", "c")]


@pytest.mark.parametrize("name,text,wanted", [
    ("in.txt", "The sea\nOnce upon a time\n", "its name (.txt); gemma-batch reads .jsonl, .json, .ndjson, .csv or .tsv"),
    ("prompts", '{"prompt": "a"}\n', "(no extension)"),
    ("in.json", ' [{"prompt": "a"}, {"prompt": "b"}]', "holds a JSON array"),
])
def test_a_file_of_no_known_format_is_refused_by_name(tmp_path: Path, name: str, text: str, wanted: str) -> None:
    """A name that says no format (or a .json holding one array) is refused, not read as JSON
    Lines whose every row fails."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UnknownFormat) as e:
        open_dataset(path)
    assert wanted in str(e.value) and str(path) in str(e.value)


def test_rows_restart_from_the_beginning_and_a_changed_file_is_refused(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path, [{"id": "x", "prompt": "a"}, {"id": "y", "prompt": "b"}])
    ds = open_dataset(path)
    first = ds.rows()
    assert next(first).id == "x"
    assert list(ds.rows()) == list(ds.rows())  # a fresh duplicate-id tracker each time: no "duplicate id"
    assert [r.id for r in ds.rows()] == ["x", "y"] and all(r.error is None for r in ds.rows())
    path.write_text(path.read_text() + '{"prompt": "c"}\n')
    with pytest.raises(DatasetError, match="changed since it was opened"):
        next(ds.rows())


def test_bom_at_start_of_file_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": 7, "prompt": "a"}\n')
    (row,) = read_all(path)
    assert (row.id, row.prompt, row.error) == ("7", "a", None)


# --- file-level errors ---------------------------------------------------------------------


def test_missing_directory_and_empty_files(tmp_path: Path) -> None:
    assert "does not exist" in dataset_error(tmp_path / "nope.jsonl")
    assert "is a directory" in dataset_error(tmp_path)
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert "has no rows" in dataset_error(empty)
    (tmp_path / "empty.parquet").write_bytes(b"")
    assert "has no rows" in dataset_error(tmp_path / "empty.parquet")
    assert "has no rows" in dataset_error(write_jsonl(tmp_path, ["", "  ", "\t"], name="blank.jsonl"))
    zero = write_parquet(tmp_path, pa.table({"prompt": pa.array([], pa.string())}), name="zero.parquet")
    assert "has no rows" in dataset_error(zero)


def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_jsonl(tmp_path, [{"prompt": "a"}])
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):  # root reads through chmod 000: make the open itself fail
            real_open = io.open

            def refuse(file, *args, **kwargs):
                if Path(file) == path:
                    raise PermissionError(13, "Permission denied", str(file))
                return real_open(file, *args, **kwargs)

            monkeypatch.setattr("builtins.open", refuse)
            monkeypatch.setattr(io, "open", refuse)
        assert "permission denied" in dataset_error(path)
    finally:
        path.chmod(0o644)


def test_truncated_parquet_and_non_parquet(tmp_path: Path) -> None:
    path = write_parquet(tmp_path, {"prompt": [f"prompt {i}" for i in range(100)]})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 20])  # footer cut off; still starts with PAR1
    assert "looks truncated or is not Parquet" in dataset_error(path)
    fake = tmp_path / "fake.parquet"
    fake.write_text('{"prompt": "a"}\n')
    assert "looks truncated or is not Parquet" in dataset_error(fake)


def test_truncated_jsonl_last_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path, [{"prompt": "a"}, "", '{"prompt": "b'], end="")
    assert "ends in the middle of a row (line 3): truncated?" in dataset_error(path)
    # A complete last line without a newline is fine; a bad line ending in "\n" is a row error.
    assert read_all(write_jsonl(tmp_path, [{"prompt": "a"}, {"prompt": "b"}], name="ok.jsonl", end=""))[1].prompt == "b"
    rows = read_all(write_jsonl(tmp_path, [{"prompt": "a"}, '{"prompt": "b'], name="bad.jsonl"))
    assert_error(rows[1], "row 1 (line 2): not valid JSON")
    # Cut inside a multi-byte character: not UTF-8, hence not JSON.
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes('{"prompt": "a"}\n{"prompt": "é"}'.encode()[:-3])
    assert "truncated?" in dataset_error(cut)


def test_parquet_missing_columns_list_what_the_file_has(tmp_path: Path) -> None:
    path = write_parquet(tmp_path, {"text": ["a"], "label": [1]})
    message = dataset_error(path)
    assert "no prompt column 'prompt' (--prompt-column, default 'prompt') and no 'messages' column" in message and "'text', 'label'" in message
    assert "--id-column 'key' is not a column" in dataset_error(path, prompt_column="text", id_column="key")
    message = dataset_error(path, prompt_column="text", keep_columns=["label", "score", "x"])
    assert "--keep-columns 'score', 'x'" in message and "'text', 'label'" in message
    ok = read_all(path, prompt_column="text", keep_columns=["label"])
    assert (ok[0].prompt, ok[0].keep) == ("a", {"label": 1})
    # A messages column stands in for the prompt column.
    chat = write_parquet(tmp_path, {"messages": [[{"role": "user", "content": "hi"}]]}, name="chat.parquet")
    (row,) = read_all(chat)
    assert (row.kind, row.messages, row.error) == ("chat", [{"role": "user", "content": "hi"}], None)


# --- row-level errors: lines, prompts, messages ---------------------------------------------


def test_bad_lines_are_error_rows(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n\nnot json\n[1, 2]\n"text"\nnull\n{"prompt": "\xff"}\n{"prompt": "z"}\n')
    rows = read_all(path)
    assert [r.index for r in rows] == list(range(7)) and [r.id for r in rows] == [str(i) for i in range(7)]
    assert rows[0].prompt == "a" and rows[6].prompt == "z"
    assert_error(rows[1], "row 1 (line 3): not valid JSON: Expecting value (column 1)")
    assert_error(rows[2], "row 2 (line 4): not a JSON object (got an array)")
    assert_error(rows[3], "row 3 (line 5): not a JSON object (got a string)")
    assert_error(rows[4], "row 4 (line 6): not a JSON object (got null)")
    assert_error(rows[5], "row 5 (line 7): not valid UTF-8 (byte 0xff at offset 12)")


@pytest.mark.parametrize(
    ("record", "fragment"),
    [
        ({"text": "a"}, "missing prompt (and no 'messages')"),
        ({"prompt": None}, "prompt is null"),
        ({"prompt": 5}, "prompt must be a string, got 5"),
        ({"prompt": ["a"]}, "prompt must be a string, got ['a']"),
        ({"prompt": ""}, "prompt is empty"),
        ({"prompt": " \n\t"}, "prompt is whitespace only"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "has both prompt and 'messages'"),
        ({"messages": None}, "messages is null"),
        ({"messages": []}, "messages must be a non-empty list"),
        ({"messages": "hi"}, "messages must be a non-empty list"),
        ({"messages": ["hi"]}, "messages[0] must be an object with 'role' and 'content', got 'hi'"),
        ({"messages": [{"content": "hi"}]}, "messages[0]: 'role' must be a string, got None"),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "user"}]}, "messages[1]: 'content' must be"),
        ({"messages": [{"role": "user", "content": [{"type": "image"}]}]}, "messages[0]: 'content' must be"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}, "messages[0]: 'content' must be"),
    ],
)
def test_prompt_and_message_errors(tmp_path: Path, record: dict, fragment: str) -> None:
    rows = read_all(write_jsonl(tmp_path, [record, {"prompt": "fine"}]))  # (a prompt key in some row)
    assert_error(rows[0], f"row 0 (line 1): {fragment}")
    assert rows[1].prompt == "fine"


def test_keys_the_flags_name_must_be_in_some_jsonl_row(tmp_path: Path) -> None:
    """A JSON Lines file with rows but no row holding a key the flags name (the prompt key with no
    'messages' either, an --id-column given, a kept column) is refused like a Parquet file without
    the column (ColumnNotFound: a usage error), naming the flag and the first row's keys. A key in
    some rows only is not: the rest are error rows or nulls. The check is the scan's byte search,
    settled by parsing the rows where it finds nothing: a key written with \\u escapes is found; a
    name only in a value passes (nulls, as before the check)."""
    path = write_jsonl(tmp_path, [{"id": "a", "text": "x", "tag": "t"}, {"id": "b", "text": "y"}])
    for kwargs, fragment in (({}, "no row has a prompt key 'prompt' (--prompt-column, default 'prompt') or 'messages'"),
                             ({"prompt_column": "text", "id_column": "key"}, "--id-column 'key': no row has such a key"),
                             ({"prompt_column": "text", "keep_columns": ["tag", "nosuch", "other"]},
                              "--keep-columns 'nosuch', 'other': no row has such a key")):
        with pytest.raises(ColumnNotFound) as e:
            open_dataset(path, **kwargs)
        assert fragment in str(e.value) and "the first row has keys: 'id', 'text', 'tag'" in str(e.value), kwargs
    rows = read_all(path, prompt_column="text", keep_columns=["tag"])
    assert [row.keep for row in rows] == [{"tag": "t"}, {"tag": None}]
    # "café" written as caf\u00e9: found; "nosuch" only as a value: passes, null
    tricky = tmp_path / "tricky.jsonl"
    tricky.write_text('{"prompt": "nosuch", "caf\\u00e9": "v"}\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    assert [row.keep for row in read_all(tricky, keep_columns=["café", "nosuch"])] == [
        {"café": "v", "nosuch": None}, {"café": None, "nosuch": None}]
    with pytest.raises(ColumnNotFound):
        open_dataset(tricky, keep_columns=["café", "other"])
    escaped = tmp_path / "escaped.jsonl"  # "other" with an escaped letter: the byte search misses it, the parse finds it
    escaped.write_text('{"prompt": "p", "\\u006fther": 1}\n')
    assert read_all(escaped, keep_columns=["other"])[0].keep == {"other": "1"}
    # no row is a JSON object: every row is an error row, as before
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json\n[1]\n")
    assert all(row.error for row in read_all(garbage, keep_columns=["x"]))


def test_custom_prompt_column_is_named_in_errors(tmp_path: Path) -> None:
    rows = read_all(write_jsonl(tmp_path, [{"text": "a", "prompt": "ignored"}, {"text": None}]), prompt_column="text")
    assert rows[0].prompt == "a"
    assert_error(rows[1], "row 1 (line 2): prompt column 'text' is null")


def test_chat_modes(tmp_path: Path) -> None:
    conversation = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    path = write_jsonl(tmp_path, [{"prompt": "a"}, {"messages": conversation}])
    auto = read_all(path)
    assert (auto[0].prompt, auto[0].messages, auto[0].kind) == ("a", None, "text")
    assert (auto[1].prompt, auto[1].messages, auto[1].kind) == (None, conversation, "chat")
    wrapped = read_all(path, chat=True)
    assert (wrapped[0].prompt, wrapped[0].kind) == (None, "chat")
    assert wrapped[0].messages == [{"role": "user", "content": "a"}]
    assert wrapped[1] == auto[1]
    plain = read_all(path, chat=False)
    assert plain[0] == auto[0]
    assert_error(plain[1], "row 1 (line 2): 'messages' need the chat template", "drop --no-chat")


# --- per-row sampling overrides --------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("max_tokens", 5, 5), ("max_tokens", 5.0, 5), ("temperature", 0, 0.0), ("temperature", 1.5, 1.5),
        ("top_p", 1, 1.0), ("top_p", 0.25, 0.25), ("top_k", 0, 0), ("top_k", 40.0, 40), ("min_p", 0, 0.0),
        ("min_p", 1, 1.0), ("seed", 0, 0), ("seed", 2**63 - 1, 2**63 - 1), ("stop", "###", ("###",)),
        ("stop", ["a", "b"], ("a", "b")), ("stop", [], ()), ("stop", ["s"] * 16, ("s",) * 16),
    ],
)  # fmt: skip
def test_valid_overrides(tmp_path: Path, name: str, value: Any, expected: Any) -> None:
    row = one_row(tmp_path, {"prompt": "p", name: value})
    assert row.error is None and row.params == {name: expected}
    assert type(row.params[name]) is type(expected)


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("temperature", "hot", "'temperature' must be a number >= 0, got 'hot'"),
        ("temperature", -0.1, "'temperature' must be a number >= 0, got -0.1"),
        ("temperature", True, "'temperature' must be a number >= 0, got True"),
        ("temperature", "NaN", "'temperature' must be a number >= 0, got 'NaN'"),
        ("max_tokens", 0, "'max_tokens' must be an integer >= 1, got 0"),
        ("max_tokens", 5.5, "'max_tokens' must be an integer >= 1, got 5.5"),
        ("max_tokens", False, "'max_tokens' must be an integer >= 1, got False"),
        ("top_p", 0, "'top_p' must be a number in (0, 1], got 0"),
        ("top_p", 1.01, "'top_p' must be a number in (0, 1], got 1.01"),
        ("top_k", -1, "'top_k' must be an integer >= 0, got -1"),
        ("min_p", 1.5, "'min_p' must be a number in [0, 1], got 1.5"),
        ("seed", -1, "'seed' must be an integer in [0, 2**63), got -1"),
        ("seed", 2**63, "'seed' must be an integer in [0, 2**63)"),
        ("stop", 5, "'stop' must be a string or a list of strings, got 5"),
        ("stop", ["a", 1], "'stop' must be a string or a list of strings"),
        ("stop", ["a", ""], "'stop' strings must not be empty"),
        ("stop", "", "'stop' strings must not be empty"),
        ("stop", ["s"] * 17, "'stop' has 17 strings; at most 16 are allowed"),
    ],
)
def test_invalid_overrides(tmp_path: Path, name: str, value: Any, fragment: str) -> None:
    assert_error(one_row(tmp_path, {"id": "r", "prompt": "p", name: value}), f"row 0 (line 1): {fragment}")


def test_non_finite_and_null_overrides(tmp_path: Path) -> None:
    nulls = {"prompt": "p", "max_tokens": None, "temperature": None, "stop": None}
    path = write_jsonl(tmp_path, ['{"prompt": "p", "temperature": NaN}', '{"prompt": "p", "top_p": Infinity}', nulls])
    rows = read_all(path)
    assert_error(rows[0], "'temperature' must be a number >= 0, got nan")
    assert_error(rows[1], "'top_p' must be a number in (0, 1], got inf")
    assert rows[2].error is None and rows[2].params == {}  # null = not overridden


def test_parquet_overrides_and_errors_name_the_row(tmp_path: Path) -> None:
    table = pa.table({
        "prompt": ["a", "b", None, "d"],
        "temperature": pa.array([0.5, None, 1.0, -1.0]),
        "stop": pa.array([["x"], None, None, None], pa.list_(pa.string())),
        "max_tokens": pa.array([10, 3, None, None], pa.int64()),
    })  # fmt: skip
    rows = read_all(write_parquet(tmp_path, table))
    assert rows[0].params == {"temperature": 0.5, "stop": ("x",), "max_tokens": 10}
    assert rows[1].params == {"max_tokens": 3}
    assert_error(rows[2], "row 2: prompt is null")
    assert rows[3].error == "row 3: 'temperature' must be a number >= 0, got -1.0"


# --- ids -----------------------------------------------------------------------------------


def test_ids_from_the_id_column_and_their_errors(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path, [
        "oops", {"id": "a", "prompt": "p"}, {"id": 12, "prompt": "p"}, {"id": None, "prompt": "p"},
        {"id": True, "prompt": "p"}, {"id": 1.5, "prompt": "p"}, {"id": "", "prompt": "p"}, {"prompt": "p"},
        {"id": "a", "prompt": None}, {"id": "b", "prompt": "p"},
    ])  # fmt: skip
    rows = read_all(path)
    # a row whose id cannot be read has none (its row number could be another row's id: "12" here)
    assert [r.id for r in rows] == [None, "a", "12", None, None, None, None, None, "a", "b"]
    assert rows[1].error is None and rows[2].error is None and rows[9].error is None
    assert_error(rows[3], "row 3 (line 4): id 'id' is null")
    assert_error(rows[4], "row 4 (line 5): id 'id' must be a string or an integer, got True")
    assert_error(rows[5], "row 5 (line 6): id 'id' must be a string or an integer, got 1.5")
    assert_error(rows[6], "row 6 (line 7): id 'id' is empty")
    assert_error(rows[7], "row 7 (line 8): id column 'id' is missing")
    assert_error(rows[8], "row 8 (line 9): duplicate id 'a' (first seen at row 1)")


def test_id_column_decided_by_the_first_object_row(tmp_path: Path) -> None:
    rows = read_all(write_jsonl(tmp_path, [{"prompt": "p"}, {"id": "x", "prompt": "p"}]))
    assert [(r.id, r.error) for r in rows] == [("0", None), ("1", None)]


def test_explicit_id_column_and_duplicates(tmp_path: Path) -> None:
    records = [{"key": k, "id": "same", "prompt": "p"} for k in ["abc", "d", 7, "abc", "7", "abc"]]
    rows = read_all(write_jsonl(tmp_path, records), id_column="key")
    assert [r.id for r in rows] == ["abc", "d", "7", "abc", "7", "abc"]
    assert [r.error is None for r in rows] == [True, True, True, False, False, False]
    assert rows[3].error == "row 3 (line 4): duplicate id 'abc' (first seen at row 0)"
    assert rows[4].error == "row 4 (line 5): duplicate id '7' (first seen at row 2)"
    assert rows[5].error == "row 5 (line 6): duplicate id 'abc' (first seen at row 0)"
    parquet = read_all(write_parquet(tmp_path, pa.table({"id": [3, 4, 3], "prompt": ["a", "b", "c"]})))
    assert [r.id for r in parquet] == ["3", "4", "3"]
    assert parquet[2].error == "row 2: duplicate id '3' (first seen at row 0)"


def test_seen_ids_merge_boundary() -> None:
    seen = SeenIds(merge_every=4)
    assert [seen.add(k, i) for i, k in enumerate("abcd")] == [None] * 4  # the 4th add merges
    assert len(seen._recent) == 0 and len(seen) == 4
    assert seen.add("c", 10) == 2 and seen.add("a", 11) == 0  # found in the merged arrays
    assert [seen.add(k, 20 + i) for i, k in enumerate("efg")] == [None] * 3  # in the recent dict
    assert seen.add("f", 30) == 21 and seen.add("d", 31) == 3
    assert seen.add("h", 23) is None and len(seen._recent) == 0 and len(seen) == 8  # second merge
    assert [seen.add(k, 99) for k in "abcdefgh"] == [0, 1, 2, 3, 20, 21, 22, 23]
    assert seen._hashes.dtype == np.uint64 and list(seen._hashes) == sorted(id_hash(k) for k in "abcdefgh")


def test_seen_ids_many_merges_against_a_set() -> None:
    seen, first, rng = SeenIds(merge_every=100), {}, np.random.default_rng(0)
    for row, key in enumerate(str(k) for k in rng.integers(0, 1500, 3000)):
        assert seen.add(key, row) == first.get(key)
        first.setdefault(key, row)
    assert len(seen) == len(first)


# --- keep columns ---------------------------------------------------------------------------


def test_jsonl_keep_columns_are_strings(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path, [{"prompt": "p", "meta": {"b": 1, "a": "é"}, "tag": "t", "n": 3},
                                  {"prompt": None, "tag": None, "n": [1, None]}, "broken"])  # fmt: skip
    ds = open_dataset(path, keep_columns=["tag", "meta", "n"])
    assert ds.keep_types == {"tag": pa.string(), "meta": pa.string(), "n": pa.string()}
    assert list(ds.keep_types) == ["tag", "meta", "n"]
    rows = list(ds.rows())
    assert rows[0].keep == {"tag": "t", "meta": '{"a": "é", "b": 1}', "n": "3"}
    assert rows[1].keep == {"tag": None, "meta": None, "n": "[1, null]"}  # kept on error rows too
    assert rows[2].keep == {"tag": None, "meta": None, "n": None}


def test_parquet_keep_columns_keep_their_types(tmp_path: Path) -> None:
    table = pa.table({"prompt": ["a", None], "score": pa.array([0.5, 1.5], pa.float32()),
                      "tags": pa.array([["x"], []], pa.list_(pa.string())), "n": [1, 2]})  # fmt: skip
    ds = open_dataset(write_parquet(tmp_path, table), keep_columns=["tags", "score"])
    assert ds.keep_types == {"tags": pa.list_(pa.string()), "score": pa.float32()}
    rows = list(ds.rows())
    assert [r.keep for r in rows] == [{"tags": ["x"], "score": 0.5}, {"tags": [], "score": 1.5}]
    assert rows[1].error == "row 1: prompt is null"


# --- round trips ------------------------------------------------------------------------------


def test_jsonl_and_parquet_give_identical_rows(tmp_path: Path) -> None:
    records = [
        {"id": "a", "prompt": "Hello", "temperature": 0.7, "max_tokens": 16, "stop": ["\n"], "source": "web"},
        {"id": "b", "prompt": " spaces ", "temperature": None, "max_tokens": None, "stop": None, "source": None},
        {"id": "c", "prompt": "¿Qué tal? 日本語", "temperature": 0.0, "max_tokens": 1, "stop": ["x"], "source": "s"},
    ]  # fmt: skip
    jsonl = write_jsonl(tmp_path, records)
    parquet = write_parquet(tmp_path, pa.Table.from_pylist(records), row_group_size=2)
    for chat in (None, True):
        from_jsonl = read_all(jsonl, keep_columns=["source"], chat=chat)
        from_parquet = read_all(parquet, keep_columns=["source"], chat=chat)
        assert from_jsonl == from_parquet and all(r.error is None for r in from_jsonl)
    assert from_jsonl[0] == InputRow(
        index=0, id="a", prompt=None, messages=[{"role": "user", "content": "Hello"}],
        params={"temperature": 0.7, "max_tokens": 16, "stop": ("\n",)}, keep={"source": "web"}, kind="chat",
    )  # fmt: skip


def test_parquet_reads_many_batches_in_order(tmp_path: Path) -> None:
    n = 3000  # three 1024-row batches, several row groups
    path = write_parquet(tmp_path, {"id": [f"r{i}" for i in range(n)], "prompt": [f"p{i}" for i in range(n)]},
                         row_group_size=700)  # fmt: skip
    rows = read_all(path)
    assert [r.index for r in rows] == list(range(n)) and rows[-1].id == f"r{n - 1}" and rows[2048].prompt == "p2048"


# --- OpenAI Batch input -------------------------------------------------------------------


def request(custom_id: Any, body: dict, url: str = "/v1/chat/completions", **extra: Any) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body, **extra}


MSGS = [{"role": "user", "content": "Hi"}]


def test_openai_chat_and_completions(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path, [
        request("c1", {"model": "gemma", "messages": MSGS, "max_completion_tokens": 20, "temperature": 0.2,
                       "stream": False, "n": 1, "frequency_penalty": 0, "presence_penalty": 0.0, "logprobs": None,
                       "user": "u", "metadata": {"k": "v"}, "store": True}, batch="b1"),
        request("c2", {"model": "gemma", "prompt": "Once", "max_tokens": 5, "stop": "\n", "seed": 1,
                       "top_p": 0.9, "top_k": 4, "min_p": 0.1}, url="/v1/completions"),
        request("c3", {"prompt": ["only one"]}, url="/v1/completions"),
    ])  # fmt: skip
    ds = open_dataset(path, keep_columns=["batch", "custom_id"])
    assert ds.format == "openai" and ds.num_rows == 3
    rows = list(ds.rows())
    assert rows[0] == InputRow(index=0, id="c1", messages=MSGS, params={"max_tokens": 20, "temperature": 0.2},
                               keep={"batch": "b1", "custom_id": "c1"}, kind="chat")  # fmt: skip
    assert rows[1] == InputRow(
        index=1, id="c2", prompt="Once", kind="text", keep={"batch": None, "custom_id": "c2"},
        params={"max_tokens": 5, "stop": ("\n",), "seed": 1, "top_p": 0.9, "top_k": 4, "min_p": 0.1},
    )  # fmt: skip
    assert (rows[2].prompt, rows[2].kind, rows[2].error) == ("only one", "text", None)
    # chat=True leaves /v1/completions prompts raw; chat=False refuses chat requests.
    assert list(open_dataset(path, chat=True).rows())[1].kind == "text"
    assert_error(list(open_dataset(path, chat=False).rows())[0], "row 0 (line 1): 'messages' need the chat template")


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        (request("x", {"messages": MSGS, "logit_bias": {}}), "body field 'logit_bias' is not supported"),
        (request("x", {"messages": MSGS, "n": 2}), "body field 'n' = 2 is not supported (only 1)"),
        (request("x", {"messages": MSGS, "stream": True}), "body field 'stream' = True is not supported (only false)"),
        (request("x", {"messages": MSGS, "n": 2, "tools": []}),
         "body field 'n' = 2 is not supported (only 1); body field 'tools' is not supported"),
        (request("x", {"messages": MSGS, "logprobs": 3}), "body logprobs must be true or false in a chat request"),
        (request("x", {"messages": MSGS, "presence_penalty": 0.5}),
         "body field 'presence_penalty' = 0.5 is not supported (only 0)"),
        (request("x", {"messages": MSGS, "temperature": "hot"}), "'temperature' must be a number >= 0, got 'hot'"),
        (request("x", {"messages": MSGS, "max_tokens": 1, "max_completion_tokens": 2}),
         "body has both 'max_tokens' and 'max_completion_tokens'"),
        (request("x", {"messages": MSGS, "max_completion_tokens": 0}), "'max_completion_tokens' must be an integer"),
        (request("x", {"prompt": "p"}), "body field 'prompt' is not supported"),
        (request("x", {}), "body has no 'messages'"),
        (request("x", {"messages": []}), "body messages must be a non-empty list"),
        (request("x", {"messages": MSGS}, url="/v1/completions"), "body field 'messages' is not supported"),
        (request("x", {"prompt": ["a", "b"]}, url="/v1/completions"),
         "body prompt must be a string (or a list of one string), got a list of 2"),
        (request("x", {"prompt": 5}, url="/v1/completions"), "body prompt must be a string, got 5"),
        (request("x", {"prompt": " "}, url="/v1/completions"), "body prompt is whitespace only"),
        (request("x", {"messages": MSGS}, url="/v1/embeddings"), "url must be '/v1/chat/completions' or"),
        ({**request("x", {"messages": MSGS}), "method": "GET"}, "method must be 'POST', got 'GET'"),
        ({**request("x", {}), "body": None}, "body is missing"),
        ({**request("x", {}), "body": "text"}, "body must be an object, got 'text'"),
    ],
)
def test_openai_request_errors(tmp_path: Path, line: dict, fragment: str) -> None:
    first = request("ok", {"messages": MSGS})
    rows = read_all(write_jsonl(tmp_path, [first, line]))
    assert rows[0].error is None
    assert rows[1].id == "x"
    assert_error(rows[1], f"row 1 (line 2): {fragment}")


def test_openai_custom_ids(tmp_path: Path) -> None:
    chat = {"messages": MSGS}
    lines = [request("a", chat), request(5, chat), request("", chat), {"method": "POST"}, request("a", chat), "{bad",
             request("b", chat)]  # fmt: skip
    rows = read_all(write_jsonl(tmp_path, lines))
    assert [r.id for r in rows] == ["a", None, None, None, "a", None, "b"]  # (unreadable: none, never a row number)
    assert_error(rows[1], "row 1 (line 2): id 'custom_id' must be a string, got 5")
    assert_error(rows[2], "row 2 (line 3): id 'custom_id' is empty")
    assert_error(rows[3], "row 3 (line 4): id column 'custom_id' is missing")
    assert_error(rows[4], "row 4 (line 5): duplicate id 'a' (first seen at row 0)")
    assert_error(rows[5], "row 5 (line 6): not valid JSON")
    assert rows[6].error is None


def test_openai_needs_all_four_keys_on_the_first_row(tmp_path: Path) -> None:
    line = request("a", {"messages": MSGS})
    del line["url"]
    assert open_dataset(write_jsonl(tmp_path, [line])).format == "jsonl"
    second = write_jsonl(tmp_path, ["", request("a", {"messages": MSGS})], name="o.jsonl")  # blank lines first
    assert open_dataset(second).format == "openai"


# --- bounded memory -------------------------------------------------------------------------


def test_rows_stream_in_bounded_memory(tmp_path: Path) -> None:
    # 50,000 rows of ~800 bytes: a 40 MB file. Holding it whole (its bytes, or the parsed rows,
    # several times larger) would exceed the 20 MB bound; streaming holds one line and one row at a
    # time plus the duplicate-id tracker (50,000 recent ids in a dict, ~5 MB).
    path = tmp_path / "big.jsonl"
    filler = "x" * 800
    with path.open("w") as f:
        f.writelines(f'{{"id": "row-{i}", "prompt": "{filler} {i}", "temperature": 0.5}}\n' for i in range(50_000))
    assert path.stat().st_size > 40_000_000
    ds = open_dataset(path)
    tracemalloc.start()
    try:
        count = 0
        for row in ds.rows():
            count += row.error is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == ds.num_rows == 50_000
    assert peak < 20_000_000, f"peak {peak / 1e6:.1f} MB"


def test_parquet_text_that_is_not_utf8_fails_only_its_row(tmp_path: Path) -> None:
    raw = pa.array([b"fine", b"bad \xff\xfe text", b"also fine"], pa.binary())
    path = write_parquet(tmp_path, pa.table({"prompt": raw.view(pa.string()), "topic": raw.view(pa.string())}))
    rows = read_all(path, keep_columns=["topic"])
    assert [r.prompt for r in rows] == ["fine", None, "also fine"]
    assert rows[1].error == "row 1: column 'prompt' is not valid UTF-8 (byte 0xff at offset 4)"
    assert rows[1].keep == {"topic": "bad \ufffd\ufffd text"}  # kept lossily, so the error row can be written


def test_a_json_unpaired_surrogate_escape_fails_only_its_row(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "x\\ud800y"}\n{"prompt": "pair \\ud83d\\ude00 ok"}\n', encoding="utf-8")
    bad, good = read_all(path)
    assert bad.error == "row 0 (line 1): not valid Unicode: an unpaired surrogate \\ud800 escape"
    assert good.error is None and good.prompt == "pair \U0001f600 ok"


@pytest.mark.parametrize("suffix,codec", [(".gz", "gzip"), (".zst", "zstd")])
def test_compressed_jsonl_streams_like_the_plain_file_and_a_cut_stream_names_the_file(
        tmp_path: Path, suffix: str, codec: str) -> None:
    """A *.jsonl.gz / *.jsonl.zst input gives the same rows as the plain file (decompressed as it
    streams); a stream cut short is a DatasetError naming the file, not a row error or "truncated?"."""
    records = [{"id": f"r{i}", "prompt": f"prompt {i} " * (i % 7), "max_tokens": 1 + i % 5} for i in range(2000)]
    plain = write_jsonl(tmp_path, records)
    packed = tmp_path / f"in.jsonl{suffix}"
    with pa.output_stream(str(packed), compression=codec) as f:
        f.write(plain.read_bytes())
    assert packed.stat().st_size < plain.stat().st_size / 3
    ds = open_dataset(packed)
    assert ds.format == "jsonl" and ds.num_rows == 2000 and ds.fingerprint == open_dataset(plain).fingerprint
    assert list(ds.rows()) == read_all(plain)
    cut = tmp_path / f"cut.jsonl{suffix}"
    cut.write_bytes(packed.read_bytes()[: packed.stat().st_size // 2])
    message = dataset_error(cut)
    assert str(cut) in message and "truncated?" not in message, message
