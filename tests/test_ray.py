"""`gemma-batch run --ray` and `GemmaStage` on a local Ray cluster of CPU workers, against local runs.

One cluster (`ray start --head`, 2 CPUs, no GPU) serves the module. The demo model, greedy and
sampled: a Ray job's file is byte for byte the file a local run writes, with workers killed, or
the job itself killed and run again.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.test_run_job import gemma_batch, write_jsonl

ray = pytest.importorskip("ray")

FLAGS = ("--max-tokens", "16", "--max-batch", "4")  # four sequences a worker, 16 rows a call (BATCH_PER_SEQUENCE)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> str:
    """The address of a Ray cluster on this machine: 2 CPUs, no GPU."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray_cli = Path(sys.executable).with_name("ray")
    started = subprocess.run([ray_cli, "start", "--head", f"--port={port}", "--num-cpus=2", "--num-gpus=0",
                              "--include-dashboard=false", "--disable-usage-stats"], capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    yield "auto"  # (the cluster `ray start` made on this machine)
    subprocess.run([ray_cli, "stop", "--force"], capture_output=True, timeout=120)


def dataset(path: Path, n: int = 40) -> Path:
    """Rows of every kind a job meets: plain and chat prompts, per-row parameters, choices, and
    rows that fail (a null prompt, a line that is not JSON, a duplicate id)."""
    rows: list = []
    for i in range(n):
        row = {"id": f"r{i}", "prompt": f"Row {i}: and the king said" + " unto them" * (i % 7)}
        if i % 5 == 1:
            row = {"id": f"r{i}", "messages": [{"role": "user", "content": f"Tell of row {i}"}]}
        if i % 5 == 2:
            row["max_tokens"] = 3 + i % 4
        if i % 5 == 3:
            row["choices"] = [" the Lord", " a man"]
        rows.append(row)
    rows[7] = {"id": "r7", "prompt": None}
    rows[11] = '{"id": "r11", "prompt": '  # not JSON
    rows[13] = {"id": "r12", "prompt": "a duplicate id"}
    return write_jsonl(path, rows)


@pytest.mark.parametrize("sampling, output", [((), "--output"), (("--temperature", "0.9", "--top-k", "40", "--seed", "7"), "--output-dir")],
                         ids=["greedy", "sampled-to-a-folder"])
def test_a_ray_job_writes_the_file_a_local_run_writes(tmp_path, cluster, sampling, output):
    src = dataset(tmp_path / "rows.jsonl")
    local = tmp_path / ("local" if output == "--output-dir" else "local.parquet")
    on_ray = tmp_path / ("ray" if output == "--output-dir" else "ray.parquet")
    done = gemma_batch("run", src, *FLAGS, *sampling, output, local)
    assert done.returncode == 0, done.stderr
    done = gemma_batch("run", src, *FLAGS, *sampling, "--ray", "--ray-address", cluster, "--workers", "2", output, on_ray,
                       timeout=300)
    assert done.returncode == 0, done.stderr
    assert "ray: 2 worker(s)" in done.stderr
    rows = pq.read_table(on_ray).to_pylist()
    assert [r["row"] for r in rows] == list(range(40))
    assert sum(r["error"] is not None for r in rows) == 3 and sum(r["choice_logprobs"] is not None for r in rows) > 0
    if output == "--output":
        assert on_ray.read_bytes() == local.read_bytes()  # rows, order, schema and the job's fingerprint
    else:
        assert [p.read_bytes() for p in sorted(on_ray.iterdir())] == [p.read_bytes() for p in sorted(local.iterdir())]
    stats = pq.read_table(on_ray.with_suffix(".stats.parquet")).to_pylist()
    total, workers = stats[0], stats[1:]
    assert total["worker"] == "all" and total["workers"] == 2 and 1 <= len(workers) <= 2  # (a worker still loading gets none)
    assert sum(w["rows"] for w in workers) == 40 and all(w["rows"] for w in workers)
    assert all(w["load_seconds"] > 0 and datetime.fromisoformat(w["ready_at"]) >= datetime.fromisoformat(total["started_at"])
               for w in workers)
    assert total["generated_tokens"] == sum(w["generated_tokens"] for w in workers) > 0
    assert (total["rows_computed"], total["rows_failed_this_run"]) == (37, 3)  # (3 rows fail: r7, r11, r13)
    assert total["backend"] == "cpu" and total["weights"] == "bf16"


def stage_processes() -> list[int]:
    found = subprocess.run(["pgrep", "-f", "ray::MapWorker"], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found]


def committed(target: Path) -> int:
    journal = target.with_name(target.name + ".partial") / "pending.jsonl"
    return journal.read_bytes().count(b"\n") if journal.exists() else 0


def test_a_worker_killed_mid_job_loses_and_repeats_no_row(tmp_path, cluster):
    src = dataset(tmp_path / "rows.jsonl", 96)
    flags = (*FLAGS, "--temperature", "0.7", "--seed", "2")
    local = gemma_batch("run", src, *flags, "--output", tmp_path / "local.parquet")
    assert local.returncode == 0, local.stderr
    target = tmp_path / "ray.parquet"
    proc = subprocess.Popen([sys.executable, "-m", "gemma_batch", "run", str(src), *flags, "--ray", "--ray-address",
                             cluster, "--workers", "2", "--output", str(target)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while proc.poll() is None and committed(target) < 10 and time.monotonic() < deadline:
        time.sleep(0.02)
    victims = stage_processes()
    assert victims and committed(target) < 96 - 16  # a worker's batch is still to come
    subprocess.run(["kill", "-9", str(victims[0])])
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert target.read_bytes() == (tmp_path / "local.parquet").read_bytes()
    assert victims[0] not in stage_processes()
    workers = pq.read_table(target.with_suffix(".stats.parquet")).to_pylist()[1:]
    assert sum(w["rows"] for w in workers) >= 96  # each batch once, and the killed worker's again


def test_a_killed_ray_job_run_again_ends_with_the_same_file(tmp_path, cluster):
    src = dataset(tmp_path / "rows.jsonl", 96)
    local = gemma_batch("run", src, *FLAGS, "--output", tmp_path / "local.parquet")
    assert local.returncode == 0, local.stderr
    target = tmp_path / "ray.parquet"
    command = [sys.executable, "-m", "gemma_batch", "run", str(src), *FLAGS, "--ray", "--ray-address", cluster,
               "--output", str(target)]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while proc.poll() is None and committed(target) < 20 and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    done_before = committed(target)
    assert 20 <= done_before < 96
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"resuming: {done_before} of 96 rows already done" in again.stderr
    assert target.read_bytes() == (tmp_path / "local.parquet").read_bytes()
    stats = pq.read_table(target.with_suffix(".stats.parquet")).to_pylist()[0]
    assert (stats["rows_resumed"], stats["rows_computed"] + stats["rows_failed_this_run"]) == (done_before, 96 - done_before)


def test_the_stage_in_a_ray_pipeline_completes_rows_as_a_local_job_does(tmp_path, cluster):
    from gemma_batch.job.spec import make_spec
    from gemma_batch.ray_data import GemmaStage, pool
    from gemma_batch.ray_data.cluster import root_cause
    from gemma_batch.ray_data.stage import WorkerMismatch

    rows = [{"id": f"p{i}", "prompt": f"In the beginning {i}", "shop": f"s{i % 3}", "temperature": 0.5 * (i % 2)}
            for i in range(10)]
    src = write_jsonl(tmp_path / "p.jsonl", rows)
    local = gemma_batch("run", src, *FLAGS, "--keep-columns", "shop", "--output", tmp_path / "local.parquet")
    assert local.returncode == 0, local.stderr
    expected = pq.read_table(tmp_path / "local.parquet").to_pylist()
    ray.init(address=cluster, logging_level="ERROR")
    try:
        done = ray.data.from_items(rows).map_batches(
            GemmaStage, fn_constructor_kwargs={"max_tokens": 16, "max_batch": 4}, batch_size=4, batch_format="pyarrow",
            compute=pool(2)).take_all()
        with pytest.raises(Exception, match="no id column 'id'"):
            ray.data.from_items([{"prompt": "no id"}]).map_batches(GemmaStage, batch_format="pyarrow", concurrency=1).take_all()
        with pytest.raises(Exception) as failed:  # a worker that fails at its start: the job says why, not Ray's traceback
            ray.data.from_items(rows[:2]).map_batches(
                GemmaStage, fn_constructor_kwargs={"spec": make_spec({"input": src}), "expect": ("another GPU", 1)},
                batch_format="pyarrow", compute=pool(1), max_restarts=0).take_all()
        assert isinstance(root_cause(failed.value), WorkerMismatch)
    finally:
        ray.shutdown()
    by_id = {r["id"]: r for r in done}
    assert sorted(by_id) == sorted(r["id"] for r in rows)
    for want in expected:
        got = by_id[want["id"]]
        assert got["row"] is None and got["shop"] == want["shop"]  # carried through; no row numbers in a pipeline
        assert {k: got[k] for k in want if k != "row"} == {k: v for k, v in want.items() if k != "row"}


def test_ray_flags_are_usage_errors_without_ray_or_with_bad_values(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "x"}])
    for flags, message in [(("--workers", "2"), "--ray-address and --workers go with --ray"),
                           (("--ray", "--workers", "0"), "--workers 0: must be >= 1"),
                           (("--ray", "--place", "0-1:cpu"), "--place splits one model")]:
        done = gemma_batch("run", src, *flags)
        assert done.returncode == 2 and message in done.stderr, done.stderr
    job = tmp_path / "job.toml"
    job.write_text('input = "a.jsonl"\nray = true\nray-address = "auto"\nworkers = 0\n')
    done = gemma_batch("run", job)  # (a job file takes the same settings)
    assert done.returncode == 2 and "--workers 0: must be >= 1" in done.stderr, done.stderr
    without = subprocess.run([sys.executable, "-c", "import sys; sys.modules['ray'] = None; from gemma_batch.cli import app; "
                              f"app(['run', {str(src)!r}, '--ray'])"], capture_output=True, text=True, timeout=120)
    assert without.returncode == 2 and "pip install 'gemma-batch[ray]'" in without.stderr
    assert not tmp_path.joinpath("a.jsonl.completions.parquet").exists()


def test_two_calls_at_once_share_one_engine_and_give_each_its_own_rows():
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa

    from gemma_batch.ray_data import GemmaStage

    stage = GemmaStage(max_tokens=12, max_batch=4, temperature=0.8)  # (no Ray here: the stage alone, on the CPU)
    batches = [pa.table({"id": [f"b{b}-{i}" for i in range(6)], "prompt": [f"Batch {b}, row {i}: and" for i in range(6)]})
               for b in range(2)]
    alone = [stage(batch).to_pylist() for batch in batches]
    with ThreadPoolExecutor(2) as pool:
        together = [table.to_pylist() for table in pool.map(stage, batches)]
    assert together == alone and [r["id"] for r in together[1]] == [f"b1-{i}" for i in range(6)]
    assert stage.rows == 24 and stage.statistics()["rows"] == 24


def test_a_worker_that_would_compute_otherwise_stops_at_its_start():
    from gemma_batch.job.spec import make_spec
    from gemma_batch.ray_data.stage import GemmaStage, WorkerMismatch

    spec = make_spec({"input": Path("x.jsonl"), "backend": "cpu"})
    with pytest.raises(WorkerMismatch, match="every worker must compute alike"):
        GemmaStage(spec=spec, expect=("vulkan on another GPU", 131072))
