"""An output belongs to the input file it was written from (the job fingerprint's `input_file`,
job/store.py): default names never collide, a job over another file does not replace it unless
told the file was renamed (--input-renamed) or --force, and every output has statistics of its own."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq

from tests.test_run_job import gemma_batch, read_rows, write_jsonl

FLAGS = ("--max-tokens", "4", "--backend", "cpu")
ROWS = [{"id": f"r{i}", "prompt": f"And it came to pass on day {i} that"} for i in range(5)]


def test_inputs_that_share_a_stem_get_outputs_of_their_own(tmp_path):
    """The reported loss: `run data.jsonl`, then `run data.parquet`, dropped the first's 5 rows.
    Also in.jsonl.zst beside in.csv."""
    write_jsonl(tmp_path / "data.jsonl", ROWS)
    pq.write_table(pa.Table.from_pylist(ROWS[:3]), tmp_path / "data.parquet")
    with pa.CompressedOutputStream(str(tmp_path / "in.jsonl.zst"), "zstd") as f:
        f.write("".join(json.dumps(r) + "\n" for r in ROWS).encode())
    (tmp_path / "in.csv").write_text("id,prompt\n" + "".join(f'{r["id"]},"{r["prompt"]}"\n' for r in ROWS[:2]))
    written = {}
    for name, count in (("data.jsonl", 5), ("data.parquet", 3), ("in.jsonl.zst", 5), ("in.csv", 2)):
        done = gemma_batch("run", tmp_path / name, *FLAGS)
        assert done.returncode == 0 and "incremental" not in done.stderr, done.stderr
        out = tmp_path / f"{name}.completions.parquet"
        assert len(read_rows(out)) == count and f"this run: {count} computed" in done.stdout
        written[out] = out.read_bytes()
    assert all(out.read_bytes() == data for out, data in written.items())  # none replaced another
    # the same prompts give the same completions from every format
    texts = {out.name: [r["completion"] for r in read_rows(out)] for out in written}
    assert texts["data.parquet.completions.parquet"] == texts["data.jsonl.completions.parquet"][:3]
    assert texts["in.csv.completions.parquet"] == texts["in.jsonl.zst.completions.parquet"][:2]


def test_an_output_written_from_another_input_is_refused_naming_both(tmp_path):
    first, second = write_jsonl(tmp_path / "a.jsonl", ROWS), write_jsonl(tmp_path / "b.jsonl", ROWS[:4])
    out = tmp_path / "out.parquet"
    assert gemma_batch("run", first, *FLAGS, "--output", out).returncode == 0
    before = out.read_bytes()

    refused = gemma_batch("run", second, *FLAGS, "--output", out)
    assert refused.returncode == 2, refused.stderr
    assert f"was written from {first}, not from this job's input {second}" in refused.stderr
    assert "--input-renamed" in refused.stderr and "--force" in refused.stderr
    assert out.read_bytes() == before and not out.with_name("out.parquet.partial").exists()

    other_settings = gemma_batch("run", second, "--max-tokens", "5", "--backend", "cpu", "--output", out, "--input-renamed")
    assert other_settings.returncode == 2 and "params.max_tokens" in other_settings.stderr  # only the input may differ

    renamed = gemma_batch("run", second, *FLAGS, "--output", out, "--input-renamed")
    assert renamed.returncode == 0, renamed.stderr
    assert "this run: 0 computed, 4 kept from an earlier input, 1 earlier rows dropped" in renamed.stdout
    assert [r["completion"] for r in read_rows(out)] == [r["completion"] for r in pq.read_table(pa.BufferReader(before)).to_pylist()][:4]
    stats = read_rows(tmp_path / "out.stats.parquet")[0]
    assert (stats["rows_computed"], stats["rows_kept"], stats["rows_dropped"]) == (0, 4, 1)

    back = gemma_batch("run", first, *FLAGS, "--output", out)  # now it belongs to b.jsonl
    assert back.returncode == 2 and f"was written from {second}" in back.stderr
    forced = gemma_batch("run", first, *FLAGS, "--output", out, "--force")
    assert forced.returncode == 0 and "this run: 5 computed" in forced.stdout
    assert out.read_bytes() == before  # the same job again: the same file


def test_an_input_and_output_moved_together_are_still_one_job(tmp_path):
    project = tmp_path / "project"
    (project / "out").mkdir(parents=True)
    src = write_jsonl(project / "in.jsonl", ROWS[:2])
    assert gemma_batch("run", src, *FLAGS, "--output", project / "out" / "o.parquet").returncode == 0
    moved = tmp_path / "moved"
    shutil.move(project, moved)
    again = gemma_batch("run", moved / "in.jsonl", *FLAGS, "--output", moved / "out" / "o.parquet")
    assert again.returncode == 0 and "already complete" in again.stderr, again.stderr


def test_every_output_has_its_own_statistics(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", ROWS[:2])
    expected = {"out.jsonl": "out.jsonl.stats.parquet", "out.csv": "out.csv.stats.parquet", "out.parquet": "out.stats.parquet"}
    for output in expected:
        assert gemma_batch("run", src, *FLAGS, "--output", tmp_path / output).returncode == 0
    for output, stats in expected.items():
        assert read_rows(tmp_path / stats)[0]["output"] == str(tmp_path / output)
