"""CSV and TSV inputs (data/csv_input.py): the header, quoting, text cells, per-row parameters, and
records with the wrong field count as error rows in their place. Expected rows are written out
here from the file's text, not from the reader."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gemma_batch.data.readers import open_dataset
from gemma_batch.data.rows import ColumnNotFound, DatasetError

TEXT = (
    '\ufeffid,prompt,max_tokens,temperature,stop,shop,choices\n'  # (a UTF-8 byte order mark first)
    'a,"The sea, and the land",3,0.5,"[""\\n"", ""END""]",phones,\n'  # quoted delimiter, a JSON list of stops
    'b,"Two\nlines, ""quoted""",,,.,,"[""yes"", ""no""]"\n'  # a line break and quotes in a field; empty = null
    'c,007,12x,,,books,\n'  # a prompt that looks like a number stays text; a bad number is that row's error
    'd,too,many,fields,here,x,y,z\n'  # 8 fields: an error row, in its place
    'e,,,,,,\n'  # an empty prompt is null
    'f,"",1,,,,\n'  # a quoted empty prompt is an empty string
    'g,short\n'  # 2 fields
    'a,duplicate,,,,,\n'
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    data = text.encode("utf-8")
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return path


@pytest.mark.parametrize("name", ["in.csv", "in.CSV", "in.csv.gz"])
def test_a_csv_file_reads_as_the_text_says(tmp_path, name):
    ds = open_dataset(write(tmp_path, name, TEXT), keep_columns=["shop"])
    assert ds.format == "csv" and ds.num_rows == 8 and ds.keep_types["shop"].equals(__import__("pyarrow").string())
    rows = list(ds.rows())
    assert [r.index for r in rows] == list(range(8))
    a, b, c, d, e, f, g, dup = rows
    assert (a.id, a.prompt, a.params, a.keep) == ("a", "The sea, and the land",
                                                  {"max_tokens": 3, "temperature": 0.5, "stop": ("\n", "END")}, {"shop": "phones"})
    assert (b.prompt, b.params, b.choices, b.keep) == ('Two\nlines, "quoted"', {"stop": (".",)}, ("yes", "no"), {"shop": None})
    assert c.error == "row 2: 'max_tokens' must be an integer >= 1, got '12x'" and c.id == "c" and c.keep == {"shop": "books"}
    assert d.error.startswith("row 3: has 8 field(s) where the header has 7") and d.id is None
    assert e.error == "row 4: prompt is null" and f.error == "row 5: prompt is empty"
    assert g.error.startswith("row 6: has 2 field(s) where the header has 7")
    assert dup.error == "row 7: duplicate id 'a' (first seen at row 0)"


def test_a_number_like_prompt_stays_text_and_ids_default_to_row_numbers(tmp_path):
    rows = list(open_dataset(write(tmp_path, "in.csv", "prompt,top_k\n007,40\nhello,\n")).rows())
    assert [(r.id, r.prompt, r.params) for r in rows] == [("0", "007", {"top_k": 40}), ("1", "hello", {})]


def test_a_tsv_file_splits_on_tabs(tmp_path):
    rows = list(open_dataset(write(tmp_path, "in.tsv", "id\tprompt\nx\ta, b; c\ny\tsecond\n")).rows())
    assert [(r.id, r.prompt) for r in rows] == [("x", "a, b; c"), ("y", "second")]


def test_messages_as_json_text_are_chat_rows(tmp_path):
    messages = [{"role": "user", "content": "Hi, there"}]
    cell = json.dumps(messages).replace('"', '""')
    (row,) = open_dataset(write(tmp_path, "in.csv", f'id,messages\nm,"{cell}"\n')).rows()
    assert (row.kind, row.messages, row.error) == ("chat", messages, None)


def test_bad_records_at_the_end_and_a_bad_byte_fail_only_their_rows(tmp_path):
    path = tmp_path / "in.csv"
    path.write_bytes(b"id,prompt\n1,fine\n2,caf\xe9\n3,x,y\n4,z,w\n")
    rows = list(open_dataset(path).rows())
    assert [(r.index, r.id, r.prompt) for r in rows[:1]] == [(0, "1", "fine")]
    assert "not valid UTF-8" in rows[1].error and rows[1].index == 1
    assert [r.index for r in rows[2:]] == [2, 3] and all("has 3 field(s)" in r.error for r in rows[2:])


@pytest.mark.parametrize("text,wanted", [
    ("id,prompt\n", "has no rows"),
    ("id,text\n1,a\n", "no prompt column 'prompt'"),
    ("id,prompt,id\n1,a,2\n", "names 'id' more than once"),
])
def test_file_level_problems_name_the_file(tmp_path, text, wanted):
    path = write(tmp_path, "in.csv", text)
    with pytest.raises(DatasetError) as e:
        open_dataset(path)
    assert wanted in str(e.value) and str(path) in str(e.value)


def test_missing_flag_columns_are_column_errors(tmp_path):
    path = write(tmp_path, "in.csv", "id,prompt\n1,a\n")
    for kw, flag in (({"id_column": "key"}, "--id-column"), ({"keep_columns": ["shop"]}, "--keep-columns")):
        with pytest.raises(ColumnNotFound) as e:
            open_dataset(path, **kw)
        assert flag in str(e.value) and "'id', 'prompt'" in str(e.value)
