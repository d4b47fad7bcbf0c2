"""Incremental jobs (job/incremental.py): a rerun over a changed input keeps the finished rows
whose request is unchanged, runs the rest, drops the rows gone, and ends with the file a fresh run
over the new input writes, byte for byte, also when it is killed midway."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq

from tests.test_run_job import gemma_batch, write_jsonl

FLAGS = ("--max-tokens", "6", "--temperature", "0.8", "--top-k", "40", "--seed", "5", "--max-batch", "8")


def rows(n: int, start: int = 0) -> list[dict]:
    return [{"id": f"r{i}", "prompt": f"Row {i}: the harvest" + " and the sea" * (i % 5)} for i in range(start, start + n)]


def run(src, out, *extra):
    done = gemma_batch("run", src, *FLAGS, "--output", out, *extra)
    assert done.returncode == 0, done.stderr
    return done


def test_a_changed_input_keeps_unchanged_rows_and_ends_as_a_fresh_run(tmp_path):
    first = rows(12)
    src = write_jsonl(tmp_path / "in.jsonl", first)
    out = tmp_path / "out.parquet"
    run(src, out)
    before = {r["id"]: r for r in pq.read_table(out).to_pylist()}

    second = [r for r in first if r["id"] != "r3"]  # deleted
    second[4] = {**second[4], "prompt": "An edited prompt"}  # r5 edited
    second[6] = {**second[6], "max_tokens": 3}  # r7: another per-row parameter
    second += rows(2, start=12)  # appended
    write_jsonl(src, second)
    again = run(src, out)
    assert "incremental: kept 9 rows, ran 4 new or changed, dropped 3 earlier rows" in again.stderr, again.stderr
    after = pq.read_table(out).to_pylist()
    assert [r["id"] for r in after] == [r["id"] for r in second] and [r["row"] for r in after] == list(range(13))
    stats = pq.read_table(out.with_suffix(".stats.parquet")).to_pylist()[0]
    assert (stats["rows_computed"], stats["rows_kept"], stats["rows_dropped"], stats["rows_failed_this_run"]) == (4, 9, 3, 0)
    assert "this run: 4 computed, 9 kept from an earlier input, 3 earlier rows dropped)" in again.stdout
    kept = [r for r in after if r["id"] not in ("r5", "r7", "r12", "r13")]
    assert all(r["completion"] == before[r["id"]]["completion"] for r in kept)

    fresh = run(src, tmp_path / "fresh.parquet")
    assert "incremental" not in fresh.stderr
    assert out.read_bytes() == (tmp_path / "fresh.parquet").read_bytes()


def test_other_settings_are_still_refused_and_force_runs_every_row(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", rows(4))
    out = tmp_path / "out.parquet"
    run(src, out)
    write_jsonl(src, rows(5))
    changed = gemma_batch("run", src, *FLAGS, "--output", out, "--seed", "6")
    assert changed.returncode == 2 and "differing: input, params.seed" in changed.stderr
    forced = run(src, out, "--force")
    assert "incremental" not in forced.stderr and "this run: 5 computed)" in forced.stdout


def kill_after(src, out, lines: int) -> None:
    """Start the job and SIGKILL it once its journal holds more than `lines` rows."""
    proc = subprocess.Popen([sys.executable, "-m", "gemma_batch", "run", str(src), *FLAGS, "--output", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = out.with_name(out.name + ".partial") / "pending.jsonl"
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline and not (
            journal.exists() and journal.read_bytes().count(b"\n") > lines):
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL, "the run ended before the kill"


def test_a_killed_incremental_run_resumes_to_a_fresh_runs_file(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", rows(20))
    out = tmp_path / "out.parquet"
    run(src, out)
    write_jsonl(src, rows(20) + rows(60, start=20))
    run(src, tmp_path / "fresh.parquet")
    kill_after(src, out, 25)  # the kept rows, and some run
    resumed = run(src, out)
    done = int(re.search(r"resuming: (\d+) of 80 rows already done", resumed.stderr).group(1))
    assert 25 < done < 80
    assert out.read_bytes() == (tmp_path / "fresh.parquet").read_bytes()


def test_a_dated_output_keeps_the_rows_of_the_latest_earlier_date(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", rows(6))
    template = tmp_path / "labels-{date}.parquet"
    run(src, template)
    [today] = [p for p in tmp_path.glob("labels-*") if re.fullmatch(r"labels-\d{4}-\d{2}-\d{2}\.parquet", p.name)]
    today.rename(tmp_path / "labels-2000-01-01.parquet")
    (tmp_path / "labels-1999-12-31.parquet").write_bytes(b"not parquet")  # an older file is not read
    write_jsonl(src, rows(8))
    second = run(src, template)
    assert "earlier rows from" in second.stderr and "labels-2000-01-01.parquet" in second.stderr
    assert "kept 6 rows, ran 2 new or changed, dropped 0" in second.stderr
    assert today.exists() and pq.read_table(today).num_rows == 8
    bad = gemma_batch("run", src, "--output", tmp_path / "labels-{day}.parquet")
    assert bad.returncode == 2 and "{date}" in bad.stderr


def test_rows_of_a_run_stopped_before_the_input_changed_are_kept(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", rows(60))
    out = tmp_path / "out.parquet"
    kill_after(src, out, 10)
    write_jsonl(src, rows(60)[5:] + rows(3, start=60))
    again = run(src, out)
    kept = int(re.search(r"incremental: kept (\d+) rows", again.stderr).group(1))
    assert 5 <= kept <= 58, again.stderr
    run(src, tmp_path / "fresh.parquet")
    assert out.read_bytes() == (tmp_path / "fresh.parquet").read_bytes()
