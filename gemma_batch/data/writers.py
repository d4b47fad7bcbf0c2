"""Files that `gemma-batch run` writes: Parquet parts, the final output assembled from them
(Parquet, or OpenAI Batch output JSONL), and the one-row stats file.

Every file is written atomically (`atomic_file`): under "<name>.tmp-<pid>" beside its
destination, flushed, fsynced, renamed over the destination, then the directory is fsynced. A
reader, or a resumed job, sees the old file or the complete new one, never a torn one; the
temporaries of a killed run are removed by the next run (`remove_stale_tmps`).

The final Parquet file is deterministic: the same rows give the same bytes however they were
split into parts, because they are re-batched into contiguous row groups of `ROW_GROUP_ROWS`
rows, dictionary-encoded columns are re-encoded per row group (a part's dictionary order depends
on where the part starts), the writer options are fixed, and nothing time-dependent is written.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq
import pyarrow.types as pt

ROW_GROUP_ROWS = 8192
FINGERPRINT_KEY = b"gemma_batch"  # Parquet schema metadata key holding the job fingerprint (JSON)
_PARQUET_OPTIONS = {"compression": "zstd"}


def set_up_arrow_meanwhile() -> threading.Thread:
    """pyarrow's one-time set-up for what the final file's write does, on a thread from now on (a
    job starts it while its steps run): its first array of Python values imports pandas where
    pandas is installed (0.2-0.4 s), its first cast pyarrow.compute (about 0.1 s)."""
    thread = threading.Thread(target=lambda: pa.array([], pa.int32()).cast(pa.int64()), name="pyarrow set-up")
    thread.start()
    return thread


def tmp_path(path: Path) -> Path:
    """This process's temporary name for `path`: "<path>.tmp-<pid>" in the same directory."""
    return path.with_name(f"{path.name}.tmp-{os.getpid()}")


def remove_stale_tmps(path: Path) -> None:
    """Delete every "<path>.tmp-*" file or folder (left by killed runs; the caller holds the lock)."""
    for stale in path.parent.glob(glob.escape(path.name) + ".tmp-*"):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale)
        else:
            stale.unlink(missing_ok=True)


def fsync_dir(path: Path) -> None:
    """Make renames and creations inside directory `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_tree(path: Path) -> None:
    """Remove folder `path` atomically: rename it to a temporary name, then delete that."""
    doomed = tmp_path(path)
    os.replace(path, doomed)
    fsync_dir(path.parent)
    shutil.rmtree(doomed)


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """Yield a binary file whose content replaces `path` atomically and durably on success.

    On an exception the temporary is removed and `path` is left as it was.
    """
    tmp = tmp_path(path)
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_part(table: pa.Table, path: Path) -> None:
    """Write `table` as the Parquet part `path`, atomically."""
    with atomic_file(path) as f:
        pq.write_table(table, f, **_PARQUET_OPTIONS)


def read_part(path: Path, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The rows of part `path` as batches of `schema` (Parquet may widen some types, e.g.
    timestamp[s] is stored as milliseconds: they are cast back)."""
    with pq.ParquetFile(path) as pf:
        for batch in pf.iter_batches(batch_size=ROW_GROUP_ROWS):
            yield batch.cast(schema)


def _without_dictionaries(t: pa.DataType) -> pa.DataType:
    """`t` with every dictionary type (at any depth) replaced by its value type."""
    if pt.is_dictionary(t):
        return _without_dictionaries(t.value_type)
    if pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t):
        field = t.value_field.with_type(_without_dictionaries(t.value_type))
        if pt.is_fixed_size_list(t):
            return pa.list_(field, t.list_size)
        return pa.list_(field) if pt.is_list(t) else pa.large_list(field)
    if pt.is_struct(t):
        return pa.struct([f.with_type(_without_dictionaries(f.type)) for f in t])
    if pt.is_map(t):
        return pa.map_(t.key_field.with_type(_without_dictionaries(t.key_type)),
                       t.item_field.with_type(_without_dictionaries(t.item_type)), t.keys_sorted)
    return t


def _canonical(table: pa.Table) -> pa.Table:
    """`table` as one chunk per column, dictionaries in order of first appearance."""
    table = table.combine_chunks()
    for i, field in enumerate(table.schema):
        plain = _without_dictionaries(field.type)
        if plain != field.type:
            table = table.set_column(i, field, table.column(i).cast(plain).cast(field.type))
    return table


def _row_groups(parts: Iterable[Path], schema: pa.Schema) -> Iterator[pa.Table]:
    """The rows of `parts` in order, as single-chunk tables of ROW_GROUP_ROWS rows (the last may
    be shorter). Holds at most about two row groups in memory."""
    buffered: list[pa.RecordBatch] = []
    count = 0
    for part in parts:
        for batch in read_part(part, schema):
            buffered.append(batch)
            count += batch.num_rows
            while count >= ROW_GROUP_ROWS:
                table = pa.Table.from_batches(buffered, schema=schema)
                yield _canonical(table.slice(0, ROW_GROUP_ROWS))
                rest = table.slice(ROW_GROUP_ROWS)
                buffered, count = rest.to_batches(), rest.num_rows
    if count:
        yield _canonical(pa.Table.from_batches(buffered, schema=schema))


def write_final_parquet(
    f: BinaryIO, parts: Iterable[Path], schema: pa.Schema, fingerprint: Mapping
) -> None:
    """Write the rows of `parts` (in order) to `f` as one Parquet file of `schema`, with
    `fingerprint` as JSON under FINGERPRINT_KEY in the schema metadata."""
    metadata = {**(schema.metadata or {}), FINGERPRINT_KEY: fingerprint_json(fingerprint)}
    with pq.ParquetWriter(f, schema.with_metadata(metadata), **_PARQUET_OPTIONS) as writer:
        for group in _row_groups(parts, schema):
            writer.write_table(group, row_group_size=ROW_GROUP_ROWS)


def openai_logprobs(tokens: list[dict] | None, kind: str) -> dict | None:
    """A row's `logprobs` in OpenAI's shape: a chat choice's {"content": [{token, logprob, bytes,
    top_logprobs}]}, a completion choice's {tokens, token_logprobs, top_logprobs, text_offset}."""
    if tokens is None:
        return None
    if kind == "chat":
        def item(t: dict) -> dict:
            return {"token": t["token"], "logprob": t["logprob"], "bytes": list(t["token"].encode())}
        return {"content": [{**item(t), "top_logprobs": [item(a) for a in t["top_logprobs"]]} for t in tokens],
                "refusal": None}
    offsets = [0]
    for t in tokens[:-1]:
        offsets.append(offsets[-1] + len(t["token"]))
    return {"tokens": [t["token"] for t in tokens], "token_logprobs": [t["logprob"] for t in tokens],
            "top_logprobs": [{a["token"]: a["logprob"] for a in t["top_logprobs"]} for t in tokens],
            "text_offset": offsets}


class OpenAIResults:
    """Builds OpenAI Batch output lines. Ids are deterministic: blake2b of the job fingerprint,
    the row index and the custom_id, so a resumed job writes the same file.

    Success rows get `response.body`, a "chat.completion" (kind "chat") or "text_completion"
    (kind "text") object. Error rows (finish_reason "error") get `error.code`
    "invalid_request" when the row failed before running (its sampling columns are null, see
    `schema.py`), else "generation_failed"; `error.message` is the row's error.
    """

    def __init__(self, fingerprint_json: bytes, *, model: str, created: int) -> None:
        self._base = hashlib.blake2b(fingerprint_json, digest_size=12)
        self._model = model
        self._created = created

    def _id(self, label: str, index: int, custom_id: str) -> str:
        h = self._base.copy()
        h.update(f"\0{label}\0{index}\0{custom_id}".encode())
        return h.hexdigest()

    def line(self, row: Mapping[str, Any], *, kind: str) -> bytes:
        """The output line of one output row: a JSON object and a newline."""
        index, custom_id = row["row"], row["id"]
        result: dict[str, Any] = {"id": "batch_req_" + self._id("batch_req", index, custom_id),
                                  "custom_id": custom_id}
        if row["finish_reason"] == "error":
            code = "invalid_request" if row["max_tokens"] is None else "generation_failed"
            result["response"] = None
            result["error"] = {"code": code, "message": row["error"] or ""}
        else:
            result["response"] = {"status_code": 200,
                                  "request_id": "req_" + self._id("req", index, custom_id),
                                  "body": self._body(row, kind, index, custom_id)}
            result["error"] = None
        return (json.dumps(result, ensure_ascii=False) + "\n").encode()

    def _body(self, row: Mapping[str, Any], kind: str, index: int, custom_id: str) -> dict:
        choice: dict[str, Any] = {"index": 0}
        if kind == "chat":
            head = {"id": "chatcmpl-" + self._id("chatcmpl", index, custom_id),
                    "object": "chat.completion"}
            choice["message"] = {"role": "assistant", "content": row["completion"]}
        else:
            head = {"id": "cmpl-" + self._id("cmpl", index, custom_id),
                    "object": "text_completion"}
            choice["text"] = row["completion"]
        choice["logprobs"] = openai_logprobs(row.get("logprobs"), kind)
        choice["finish_reason"] = row["finish_reason"]
        prompt, completion = row["prompt_tokens"] or 0, row["completion_tokens"] or 0
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                 "prompt_tokens_details": {"cached_tokens": row.get("cached_prompt_tokens") or 0}}  # (as OpenAI's)
        return {**head, "created": self._created, "model": self._model, "choices": [choice],
                "usage": usage}


def write_final_openai(
    f: BinaryIO,
    parts: Iterable[Path],
    part_schema: pa.Schema,
    fingerprint: Mapping,
    *,
    model: str,
    kind_column: str,
) -> None:
    """Write the rows of `parts` (in order) to `f` as OpenAI Batch output lines; each row's
    request kind ("chat" / "text") is in column `kind_column`."""
    results = OpenAIResults(fingerprint_json(fingerprint), model=model,
                            created=int(fingerprint.get("created", 0)))
    for part in parts:
        for batch in read_part(part, part_schema):
            f.writelines(results.line(row, kind=row[kind_column]) for row in batch.to_pylist())


def read_parquet_fingerprint(path: Path) -> dict | None:
    """The fingerprint stored in Parquet file `path`, or None (no such key, not Parquet)."""
    try:
        raw = (pq.read_schema(path).metadata or {})[FINGERPRINT_KEY]
        return json.loads(raw)
    except (OSError, KeyError, ValueError, pa.ArrowException):
        return None


def fingerprint_json(fingerprint: Mapping) -> bytes:
    """The canonical JSON of a fingerprint (sorted keys, compact)."""
    return json.dumps(fingerprint, sort_keys=True, separators=(",", ":")).encode()


def write_stats(path: Path, stats: Mapping[str, int | float | str] | Sequence[Mapping[str, int | float | str]]) -> None:
    """Write `stats` as a Parquet file at `path`, atomically: one row (one column per key, in
    order), or one row per mapping of a list (the keys of all, null where a row lacks one).
    Values must be int, float or str (bool is stored as bool)."""
    rows = [stats] if isinstance(stats, Mapping) else list(stats)
    for row in rows:
        for key, value in row.items():
            if not isinstance(value, (int, float, str)):
                raise TypeError(f"stats[{key!r}]: expected int, float or str, got {type(value).__name__}")
    keys = list(dict.fromkeys(key for row in rows for key in row))
    table = pa.table({key: [row.get(key) for row in rows] for key in keys})
    with atomic_file(path) as f:
        pq.write_table(table, f, **_PARQUET_OPTIONS)
