"""The result store: exact round trips, resume after crashes (simulated and real SIGKILL),
deterministic final files, fingerprint checks, the output lock, OpenAI output, stats."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import tracemalloc
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gemma_batch.data import writers
from gemma_batch.data.schema import output_schema
from gemma_batch.job import store as store_module
from gemma_batch.job.lock import JobLocked, OutputLock
from gemma_batch.job.store import JobMismatch, ResultStore, StoreCorrupt

REPO = Path(__file__).resolve().parents[1]
KEEP = {
    "n": pa.int64(),
    "ts": pa.timestamp("us", tz="UTC"),
    "tags": pa.list_(pa.string()),
    "price": pa.decimal128(12, 3),
    "blob": pa.binary(),
    "meta": pa.struct([("a", pa.int32()), ("b", pa.list_(pa.float32()))]),
    "day": pa.date32(),
    "sec": pa.timestamp("s"),  # Parquet stores seconds as milliseconds: must come back as seconds
    "cat": pa.dictionary(pa.int32(), pa.string()),
    "attrs": pa.map_(pa.string(), pa.int64()),
}
SCHEMA = output_schema(KEEP)
FP = {"version": 1, "model": "m1", "params": {"temperature": 0.7, "seed": 1}}
TEXTS = ["héllo\nwörld", 'quote " and \\ back', "\ufffd repl", "🦙👩‍👩‍👧", "", "a\u2028b\r\n", "t\tz\x00"]
T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def make_row(i: int, kind: str = "text") -> dict:
    """A deterministic output row for index i: every few rows an error row or null keep values."""
    error = i % 11 == 3
    run = not (error and i % 2)  # odd error rows failed before running: sampling columns null
    nulls = i % 13 == 5
    return {
        "row": i,
        "id": f"id-{i}",
        "request_hash": f"{i:032x}",
        "completion": None if error else TEXTS[i % len(TEXTS)] + str(i),
        "finish_reason": "error" if error else ("stop", "length")[i % 2],
        "prompt_tokens": 10 + i % 7 if run else None,
        "cached_prompt_tokens": 8 * (i % 2) if run else None,
        "completion_tokens": i % 5 if run else None,
        "max_tokens": 64 if run else None,
        "temperature": (0.1, 0.7, -0.0, 1e-300)[i % 4] if run else None,
        "top_k": 0 if run else None,
        "top_p": 1 / 3 if run else None,
        "min_p": 0.0 if run else None,
        "seed": 2**63 - 1 - i if run else None,
        "stop": ["\n\n", "</s>"] if run else None,
        "choice_logprobs": [{"choice": "yes", "logprob": -0.1 * i, "probability": 1 / 3}, {"choice": " no", "logprob": -1e-300,
                            "probability": 2 / 3}] if run and not error and i % 3 == 0 else None,
        "logprobs": [{"token_id": i, "token": "é" * (i % 3), "logprob": -i / 7, "top_logprobs": [
            {"token_id": 0, "token": "<pad>", "logprob": -1e300}][: i % 2]}] if run and not error and i % 4 == 1 else None,
        "error": ("prompt is too long" if run else "prompt is null") if error else None,
        "n": None if nulls else i * 1000,
        "ts": None if nulls else T0 + timedelta(microseconds=1234567 * i),
        "tags": None if nulls else [f"t{i}", "ü", None][: i % 4],
        "price": None if nulls else Decimal(f"{i}.{i % 1000:03d}"),
        "blob": None if nulls else bytes([i % 256, 0, 255, 10]),
        "meta": None if nulls else {"a": i, "b": [0.5, 1.25, None]},
        "day": None if nulls else date(2000, 1, 1) + timedelta(days=i),
        "sec": None if nulls else datetime(2001, 2, 3) + timedelta(seconds=i),
        "cat": None if nulls else ("red", "green")[i % 2],
        "attrs": None if nulls else [("k", i), ("z", None)],
        "_kind": kind,  # not a column: ignored by parquet stores
    }


def expected(n: int) -> list[dict]:
    return [{k: v for k, v in make_row(i).items() if k != "_kind"} for i in range(n)]


def windowed(indices: list[int], rng: random.Random, window: int = 40) -> list[int]:
    """`indices` shuffled, but no row more than `window` positions ahead of its place."""
    return sorted(indices, key=lambda i: i + rng.uniform(0, window))


def run_store(out: Path, order: list[int], n: int, finalize: bool = True, **kw) -> ResultStore:
    store = ResultStore(out, SCHEMA, FP, **kw)
    store.open()
    for i in order:
        if not store.is_done(i):
            store.commit(make_row(i))
    if finalize:
        store.finalize(n)
    return store


@pytest.fixture
def reference(tmp_path: Path) -> bytes:
    """Final file bytes of an uninterrupted in-order run of 100 rows (no compaction before
    finalize), with small row groups so that re-batching across parts is exercised."""
    out = tmp_path / "ref" / "out.parquet"
    out.parent.mkdir()
    run_store(out, list(range(100)), 100)
    return out.read_bytes()


@pytest.fixture(autouse=True)
def small_row_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writers, "ROW_GROUP_ROWS", 16)


def test_out_of_order_commits_finalize_in_order(tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    store = run_store(out, windowed(list(range(100)), random.Random(1)), 100)
    assert store.state == "complete" and not store.partial_dir.exists()
    table = pq.read_table(out)
    # Parquet has no seconds unit: a timestamp[s] column is read back as timestamp[ms]
    sec = SCHEMA.get_field_index("sec")
    assert table.schema.equals(SCHEMA.set(sec, pa.field("sec", pa.timestamp("ms"))))
    assert json.loads(table.schema.metadata[b"gemma_batch"]) == FP
    assert table.to_pylist() == expected(100)
    assert pq.ParquetFile(out).metadata.num_row_groups == 7  # 6 x 16 rows + 4


def test_commit_validates(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "out.parquet", SCHEMA, FP)
    store.open()
    store.commit(make_row(0))
    with pytest.raises(ValueError, match="already committed"):
        store.commit(make_row(0))
    with pytest.raises(ValueError, match="missing \\['top_k'\\]"):
        store.commit({k: v for k, v in make_row(1).items() if k != "top_k"})
    with pytest.raises(ValueError, match="'finish_reason' must not be null"):
        store.commit({**make_row(1), "finish_reason": None})
    with pytest.raises(TypeError, match="'top_k'"):
        store.commit({**make_row(1), "top_k": "3"})
    with pytest.raises(ValueError, match="row 1 is not committed"):
        store.finalize(2)
    assert store.num_done == 1


def test_resume_after_crash_gives_same_bytes(tmp_path: Path, reference: bytes) -> None:
    out = tmp_path / "out.parquet"
    order = windowed(list(range(100)), random.Random(2))
    run_store(out, order[:57], 100, finalize=False)  # dropped without finalize: a crash
    store = ResultStore(out, SCHEMA, FP)
    store.open()
    assert store.state == "resume" and store.num_done == 57
    assert [store.is_done(i) for i in range(100)] == [i in set(order[:57]) for i in range(100)]
    for i in order[57:]:
        store.commit(make_row(i))
    store.finalize(100)
    assert out.read_bytes() == reference


def test_torn_journal_tail_is_cut(tmp_path: Path, reference: bytes) -> None:
    out = tmp_path / "out.parquet"
    store = run_store(out, list(range(30)), 100, finalize=False)
    journal = store.partial_dir / "pending.jsonl"
    size = journal.stat().st_size
    with open(journal, "ab") as f:
        f.write('{"row":30,"id":"id-30","completion":"h\u00e9'.encode())  # killed mid-write
    store = run_store(out, [], 100, finalize=False)
    assert store.state == "resume" and store.num_done == 30 and not store.is_done(30)
    assert journal.stat().st_size == size
    run_store(out, range(100), 100)
    assert out.read_bytes() == reference


def test_crash_between_part_and_journal_rewrite(
    tmp_path: Path, reference: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out.parquet"
    real_atomic_file = writers.atomic_file

    def killed_at_journal_rewrite(path: Path):
        if path.name == "pending.jsonl":
            raise KeyboardInterrupt  # stands for a kill after the part's rename
        return real_atomic_file(path)

    monkeypatch.setattr(store_module.writers, "atomic_file", killed_at_journal_rewrite)
    with pytest.raises(KeyboardInterrupt):
        run_store(out, list(range(25)), 100, finalize=False, compact_every=20)
    monkeypatch.setattr(store_module.writers, "atomic_file", real_atomic_file)
    partial = out.with_name("out.parquet.partial")
    assert [p.name for p in partial.glob("part-*")] == ["part-000000000000-000000000020.parquet"]
    assert len((partial / "pending.jsonl").read_bytes().splitlines()) == 20  # rows 0..19 still there
    store = run_store(out, [], 100, finalize=False, compact_every=20)
    assert store.state == "resume" and store.num_done == 20
    run_store(out, range(100), 100, compact_every=20)
    assert out.read_bytes() == reference


def test_crash_after_final_rename(tmp_path: Path, reference: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out.parquet"

    def killed(path: Path) -> None:
        raise KeyboardInterrupt  # stands for a kill before the partial folder is removed

    real_remove_tree = writers.remove_tree
    monkeypatch.setattr(store_module.writers, "remove_tree", killed)
    with pytest.raises(KeyboardInterrupt):
        run_store(out, range(100), 100)
    monkeypatch.setattr(store_module.writers, "remove_tree", real_remove_tree)
    out.write_bytes(b"stale")  # whatever the output holds, the partial folder decides
    store = run_store(out, [], 100, finalize=False)
    assert store.state == "resume" and store.num_done == 100
    store.finalize(100)
    assert out.read_bytes() == reference and not store.partial_dir.exists()


def test_compaction_across_parts_and_resume(tmp_path: Path, reference: bytes) -> None:
    out = tmp_path / "out.parquet"
    order = windowed(list(range(100)), random.Random(3))
    store = run_store(out, order[:61], 100, finalize=False, compact_every=7)
    parts = sorted(p.name for p in store.partial_dir.glob("part-*.parquet"))
    assert len(parts) >= 4 and parts[0].startswith("part-000000000000-")
    assert len(store._pending) < 40  # only rows beyond the frontier stay in memory
    store = run_store(out, order, 100, compact_every=7)
    assert out.read_bytes() == reference


def test_missing_part_is_corruption(tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    store = run_store(out, range(30), 30, finalize=False, compact_every=10)
    (store.partial_dir / "part-000000000010-000000000020.parquet").unlink()
    with pytest.raises(StoreCorrupt, match="does not continue the rows \\[0, 10\\)"):
        ResultStore(out, SCHEMA, FP).open()


def test_final_parquet_independent_of_part_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dictionary columns included: a part's dictionary order depends on where the part starts."""
    monkeypatch.setattr(writers, "ROW_GROUP_ROWS", 8)
    t = pa.dictionary(pa.int8(), pa.string())
    schema = pa.schema([pa.field("c", t), pa.field("l", pa.list_(t))])
    vals = list("xyxyxyxw") + list("zyzyzzyx") + list("qqqq")

    def final(splits: list[tuple[int, int]]) -> bytes:
        parts = []
        for a, b in splits:
            parts.append(tmp_path / f"part-{a}-{b}.parquet")
            chunk = pa.table({"c": pa.array(vals[a:b], t), "l": pa.array([[v] for v in vals[a:b]], pa.list_(t))})
            writers.write_part(chunk, parts[-1])
        dest = tmp_path / f"final-{len(splits)}-{splits[0][1]}.parquet"
        with writers.atomic_file(dest) as f:
            writers.write_final_parquet(f, parts, schema, FP)
        assert pq.read_table(dest).column("c").to_pylist() == vals
        return dest.read_bytes()

    assert final([(0, 20)]) == final([(0, 8), (8, 20)]) == final([(0, 9), (9, 20)]) == final([(0, 3), (3, 20)])


def test_fingerprint_mismatch_force_and_complete(tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    run_store(out, range(5), 10, finalize=False)
    other = {**FP, "params": {**FP["params"], "temperature": 0.8}}
    with pytest.raises(JobMismatch, match=r"differing: params\.temperature\).*--force"):
        ResultStore(out, SCHEMA, other).open()
    store = ResultStore(out, SCHEMA, other, force=True)
    store.open()
    assert store.state == "fresh" and store.num_done == 0
    for i in range(10):
        store.commit(make_row(i))
    store.finalize(10)

    same = ResultStore(out, SCHEMA, other)
    same.open()
    assert same.state == "complete"
    with pytest.raises(JobMismatch, match=r"differing: model, params\.temperature\)"):
        ResultStore(out, SCHEMA, {**FP, "model": "m2"}).open()
    again = ResultStore(out, SCHEMA, other, force=True)  # force runs a complete job again
    again.open()
    assert again.state == "fresh"
    out.with_name("out.parquet.stray").write_bytes(b"not parquet")
    with pytest.raises(JobMismatch, match="no readable job fingerprint"):
        ResultStore(out.with_name("out.parquet.stray"), SCHEMA, FP).open()


def test_output_lock(tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    with OutputLock(out):
        with pytest.raises(JobLocked, match=f"pid {os.getpid()}\\) is writing .*out.parquet"):
            OutputLock(out).__enter__()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path\n"
         "from gemma_batch.job.lock import OutputLock\n"
         "with OutputLock(Path(sys.argv[1])):\n print('locked', flush=True); time.sleep(60)", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(JobLocked, match=f"pid {holder.pid}\\)"):
            OutputLock(out).__enter__()
    finally:
        holder.kill()
        holder.wait()
    with OutputLock(out):  # released by the holder's death
        assert out.with_name("out.parquet.lock").read_text() == f"{os.getpid()}\n"


def test_sigkill_at_random_times(tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    n = 4000
    script = (
        "import random, sys, time\nfrom pathlib import Path\n"
        "from gemma_batch.job.store import ResultStore\n"
        "from tests.test_store import FP, SCHEMA, make_row, windowed\n"
        "store = ResultStore(Path(sys.argv[1]), SCHEMA, FP, compact_every=50)\nstore.open()\n"
        "print(store.num_done, flush=True)\n"
        "for i in windowed([i for i in range(4000) if not store.is_done(i)], random.Random(int(sys.argv[2]))):\n"
        "    store.commit(make_row(i))\n    time.sleep(0.0002)\n"
        "print('all', flush=True)\ntime.sleep(60)\n"
    )
    rng = random.Random(1234)
    progress = []
    for kill in range(4):
        child = subprocess.Popen([sys.executable, "-c", script, str(out), str(kill)],
                                 cwd=REPO, stdout=subprocess.PIPE, text=True)
        progress.append(int(child.stdout.readline()))
        journal = out.with_name("out.parquet.partial") / "pending.jsonl"
        deadline = time.monotonic() + 20  # (a loaded machine may start the child's commits late)
        while time.monotonic() < deadline and not (journal.exists() and journal.stat().st_size):
            time.sleep(0.002)
        time.sleep(rng.uniform(0.05, 0.4))
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert progress == sorted(progress) and 0 < progress[-1] < n  # killed mid-job, resumed
    store = ResultStore(out, SCHEMA, FP, compact_every=50)
    store.open()
    assert store.state == "resume" and store.num_done >= progress[-1]
    for i in range(n):
        if not store.is_done(i):
            store.commit(make_row(i))
    store.finalize(n)
    rows = pq.read_table(out, columns=["row"]).column("row").to_pylist()
    assert rows == list(range(n))

    ref = tmp_path / "ref.parquet"
    run_store(ref, range(n), n)
    assert out.read_bytes() == ref.read_bytes()


def test_openai_output(tmp_path: Path) -> None:
    schema = output_schema({})
    fp = {**FP, "created": 1700000000}

    def write(out: Path, fingerprint: dict) -> list[dict]:
        store = ResultStore(out, schema, fingerprint, output_format="openai", openai_model="gemma-3-1b-it")
        store.open()
        for i in (2, 0, 3, 1, 4):
            row = {k: v for k, v in make_row(i, "chat" if i < 3 else "text").items() if k in schema.names}
            store.commit({**row, "_kind": "chat" if i < 3 else "text"})
        store.finalize(5)
        return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]

    lines = write(tmp_path / "a.jsonl", fp)
    assert lines == write(tmp_path / "b.jsonl", fp)  # deterministic ids
    assert lines[0]["id"] != write(tmp_path / "c.jsonl", {**fp, "model": "x"})[0]["id"]
    assert [x["custom_id"] for x in lines] == [f"id-{i}" for i in range(5)]
    ok, err = lines[0], lines[3]
    assert ok["id"].startswith("batch_req_") and len(ok["id"]) == 10 + 24 and ok["error"] is None
    body = ok["response"]["body"]
    assert ok["response"]["status_code"] == 200 and ok["response"]["request_id"].startswith("req_")
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["created"] == 1700000000 and body["model"] == "gemma-3-1b-it"
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": make_row(0)["completion"]},
                                "logprobs": None, "finish_reason": "stop"}]
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 0, "total_tokens": 10,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert lines[1]["response"]["body"]["usage"]["prompt_tokens_details"] == {"cached_tokens": 8}
    assert err == {"id": err["id"], "custom_id": "id-3", "response": None,
                   "error": {"code": "invalid_request", "message": "prompt is null"}}
    text = lines[4]["response"]["body"]
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == make_row(4)["completion"]
    store = ResultStore(tmp_path / "a.jsonl", schema, fp, output_format="openai")
    store.open()
    assert store.state == "complete"
    with pytest.raises(ValueError, match="_kind"):
        fresh = ResultStore(tmp_path / "d.jsonl", schema, fp, output_format="openai")
        fresh.open()
        fresh.commit({k: v for k, v in make_row(0).items() if k in schema.names})


def test_openai_generation_failed_code(tmp_path: Path) -> None:
    schema = output_schema({})
    store = ResultStore(tmp_path / "o.jsonl", schema, FP, output_format="openai")
    store.open()
    row = {k: v for k, v in make_row(14).items() if k in schema.names}  # an error row that ran
    store.commit({**row, "row": 0, "_kind": "text"})
    store.finalize(1)
    line = json.loads((tmp_path / "o.jsonl").read_text())
    assert line["error"] == {"code": "generation_failed", "message": "prompt is too long"}


def test_write_stats(tmp_path: Path) -> None:
    stats = {"rows_total": 10, "wall_seconds": 0.1, "backend": "cpu", "ok": True}
    for name, stats_name in (("out.parquet", "out.stats.parquet"), ("out.jsonl", "out.jsonl.stats.parquet"),
                             ("out.csv", "out.csv.stats.parquet"), ("parts", "parts.stats.parquet")):
        store = ResultStore(tmp_path / name, SCHEMA, FP)
        path = store.write_stats(stats)
        assert path == tmp_path / stats_name  # one for each output: out.jsonl's and out.csv's differ
        assert pq.read_table(path).to_pylist() == [stats]
    with pytest.raises(TypeError, match="stats\\['x'\\]"):
        store.write_stats({"x": [1]})


def test_memory_stays_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writers, "ROW_GROUP_ROWS", 8192)
    schema = output_schema({})
    n, traced, window, compact_every = 100_000, 40_000, 200, 1000
    store = ResultStore(tmp_path / "big.parquet", schema, FP, compact_every=compact_every)
    store.open()
    row = {k: v for k, v in make_row(3).items() if k in schema.names}  # a small (error) row
    order = windowed(list(range(n)), random.Random(5), window)
    for k, i in enumerate(order):
        if k == n - traced:  # trace the last 40k commits only: tracemalloc costs ~80 us a row
            tracemalloc.start()
        row["row"] = i
        store.commit(row)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # A journal line is ~230 bytes, ~300 with its bytes header and dict slot: a store holding
    # every row would grow by ~12 MB over the traced commits. This one holds at most
    # compact_every + window lines (~0.4 MB) plus, during a compaction, those rows decoded
    # (~1.2k dicts of 14 keys, ~1.5 MB); Arrow's buffers (outside tracemalloc's view) are freed
    # once each part is written.
    assert peak < 4_000_000, peak
    assert len(store._pending) <= compact_every + window
    store.finalize(n)
    assert pq.read_metadata(tmp_path / "big.parquet").num_rows == n
