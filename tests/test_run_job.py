"""`gemma-batch run` end to end on the demo model: outputs, formats, bad input, specs, exit codes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gemma_batch.job.lock import OutputLock
from gemma_batch.job.spec import DEMO_MODEL

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_data"


def gemma_batch(*args: str, cwd: Path | None = None, timeout: float = 120, env: dict | None = None
                ) -> subprocess.CompletedProcess:
    """`gemma-batch ARGS`, its environment this one's with `env` on top."""
    return subprocess.run([sys.executable, "-m", "gemma_batch", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=None if env is None else {**os.environ, **env})


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def read_rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


@pytest.fixture()
def sample_jsonl(tmp_path) -> Path:
    return Path(shutil.copy(SAMPLES / "prompts.jsonl", tmp_path / "prompts.jsonl"))


def test_the_readme_command_runs_the_sample_dataset_with_no_other_flag(sample_jsonl):
    done = gemma_batch("run", sample_jsonl)
    assert done.returncode == 0, done.stderr
    out = sample_jsonl.with_name("prompts.jsonl.completions.parquet")
    rows = read_rows(out)
    source = [json.loads(line) for line in sample_jsonl.read_text().splitlines()]
    assert [r["id"] for r in rows] == [s["id"] for s in source] and [r["row"] for r in rows] == list(range(len(rows)))
    assert all(r["error"] is None and r["finish_reason"] in ("stop", "length") for r in rows)
    assert all(r["completion_tokens"] <= 256 and r["max_tokens"] == 256 and r["temperature"] == 0.0 for r in rows)
    stats = read_rows(sample_jsonl.with_name("prompts.jsonl.completions.stats.parquet"))[0]
    assert stats["rows_total"] == len(rows) and stats["generated_tokens"] == sum(r["completion_tokens"] for r in rows)
    # rates over the time each kind of step took, times that add up, when and with what it ran
    assert 0 < stats["prefill_seconds"] and 0 < stats["decode_seconds"]
    assert stats["prefill_seconds"] + stats["decode_seconds"] <= stats["wall_seconds"]
    assert stats["prefill_tokens_per_s"] == stats["prefill_tokens"] / stats["prefill_seconds"]
    assert stats["rows_per_s"] == len(rows) / stats["wall_seconds"]
    started, ended = (datetime.fromisoformat(stats[k]) for k in ("started_at", "ended_at"))
    assert started.tzinfo is not None and 0 <= (ended - started).total_seconds() <= stats["wall_seconds"] + 2
    assert (stats["weights"], stats["kv_dtype"], stats["backend"]) == ("bf16", "fp32", "cpu")
    assert "backend: cpu (auto" in done.stderr  # auto says what it picked
    assert f"/{len(rows)} rows (100.0%)" in done.stderr  # plain progress lines off a terminal
    assert "decode" in done.stdout and "tok/s" in done.stdout
    # the start-up (process start to first step) split into phases that add up to at most it, said once
    phases = {k: v for k, v in stats.items() if k.startswith("startup_") and k != "startup_seconds"}
    assert {"startup_imports_s", "startup_model_files_s", "startup_weights_read_s", "startup_kv_cache_s"} <= set(phases)
    assert all(v >= 0 for v in phases.values()) and 0 < sum(phases.values()) <= stats["startup_seconds"] + 0.02
    assert done.stderr.count("start-up ") == 1 and f"start-up {stats['startup_seconds']:.1f} s: imports" in done.stderr
    assert not sample_jsonl.with_name("prompts.jsonl.completions.parquet.partial").exists()

    again = gemma_batch("run", sample_jsonl)  # a finished job is a no-op
    assert again.returncode == 0 and "already complete" in again.stderr
    assert read_rows(out) == rows


def test_help_documents_every_flag():
    done = gemma_batch("run", "--help")
    from gemma_batch.job.spec import JobSpec

    flags = [f"--{name.replace('_', '-')}" for name in JobSpec.__dataclass_fields__ if name != "input"]
    assert done.returncode == 0
    assert [f for f in flags if f not in done.stdout] == []


def test_parquet_input_keeps_columns_and_applies_row_overrides(tmp_path):
    src = Path(shutil.copy(SAMPLES / "prompts.parquet", tmp_path / "p.parquet"))
    done = gemma_batch("run", src, "--keep-columns", "topic", "--max-tokens", "40", "--output", tmp_path / "o.parquet")
    assert done.returncode == 0, done.stderr
    table = pq.read_table(tmp_path / "o.parquet")
    source = pq.read_table(src).to_pylist()
    assert table.column_names[-1] == "topic" and table.column("topic").to_pylist() == [s["topic"] for s in source]
    for row, s in zip(table.to_pylist(), source):
        assert row["max_tokens"] == (s["max_tokens"] or 40) and row["completion_tokens"] <= row["max_tokens"]


def test_stop_strings_cut_the_completion_before_them(tmp_path):
    src = write_jsonl(tmp_path / "s.jsonl", [{"id": "a", "prompt": "The sea was calm that morning, and"}])
    plain = read_rows(tmp_path / "s.jsonl.completions.parquet") if gemma_batch("run", src, "--max-tokens", "40").returncode == 0 else None
    text = plain[0]["completion"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    done = gemma_batch("run", src, "--max-tokens", "40", "--stop", stop, "--output", tmp_path / "stopped.parquet")
    assert done.returncode == 0, done.stderr
    row = read_rows(tmp_path / "stopped.parquet")[0]
    assert row["completion"] == text[: text.index(stop)] and row["finish_reason"] == "stop" and row["stop"] == [stop]


def test_bad_rows_become_error_rows_and_the_job_goes_on(tmp_path):
    long_prompt = "word " * 300
    src = write_jsonl(tmp_path / "bad.jsonl", [
        {"id": "ok", "prompt": "The sea"},
        {"id": "null", "prompt": None},
        {"id": "num", "prompt": 42},
        {"id": "empty", "prompt": "  "},
        "{not json",
        {"id": "ok", "prompt": "duplicate id"},
        {"id": "hot", "prompt": "x", "temperature": "hot"},
        {"id": "long", "prompt": long_prompt},
        {"id": "chat", "messages": [{"role": "user"}]},
        {"id": "surrogate", "prompt": "half a pair \ud800 here"},
        {"id": "many", "prompt": "x", "max_tokens": "many"},  # (also read before the model loads: row_bound.py)
        {"id": "ok2", "prompt": "Once upon a time"},
    ])
    done = gemma_batch("run", src, "--max-tokens", "8", "--max-model-len", "128")
    assert done.returncode == 0, done.stderr
    rows = read_rows(tmp_path / "bad.jsonl.completions.parquet")
    assert [r["finish_reason"] == "error" for r in rows] == [False] + [True] * 10 + [False]
    errors = [r["error"] or "" for r in rows]
    for i, fragment in [(1, "null"), (2, "string"), (3, "whitespace"), (4, "JSON"), (5, "duplicate id 'ok'"),
                        (6, "temperature"), (7, "context is 128 tokens"), (8, "content"), (9, "surrogate"),
                        (10, "max_tokens")]:
        assert fragment in errors[i] and f"row {i}" in errors[i], errors[i]
    assert rows[0]["completion"] is not None and rows[11]["completion"] is not None
    assert rows[4]["id"] is None and rows[4]["row"] == 4  # unreadable: no id, never a row number posing as one
    assert rows[7]["prompt_tokens"] > 128 and f"prompt is {rows[7]['prompt_tokens']} tokens" in rows[7]["error"]

    strict = gemma_batch("run", src, "--max-tokens", "8", "--max-model-len", "128", "--fail-on-row-error",
                         "--output", tmp_path / "strict.parquet")
    assert strict.returncode == 1 and "10 row(s) failed" in strict.stderr
    assert len(read_rows(tmp_path / "strict.parquet")) == 12  # the output is still written
    rerun = gemma_batch("run", src, "--max-tokens", "8", "--max-model-len", "128", "--fail-on-row-error",
                        "--output", tmp_path / "strict.parquet")
    assert rerun.returncode == 1 and "already complete" in rerun.stderr  # the verdict does not change


@pytest.mark.parametrize(
    "content,message",
    [(b"", "no rows"), (b"\n\n", "no rows"), (b'{"prompt": "a"}\n{"prompt": "tru', "truncated")],
)
def test_file_level_problems_stop_the_job_before_anything_is_written(tmp_path, content, message):
    src = tmp_path / "in.jsonl"
    src.write_bytes(content)
    done = gemma_batch("run", src)
    assert done.returncode == 2 and message in done.stderr and str(src) in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_usage_errors_exit_2(tmp_path, sample_jsonl):
    assert gemma_batch("run", tmp_path / "missing.jsonl").returncode == 2
    assert gemma_batch("run", sample_jsonl, "--top-p", "0").returncode == 2
    assert gemma_batch("run", sample_jsonl, "--backend", "tpu").returncode == 2
    assert gemma_batch("run", sample_jsonl, "--kv-memory", "lots").returncode == 2
    assert gemma_batch("run", sample_jsonl, "--output", tmp_path / "no" / "such" / "dir.parquet").returncode == 2
    same = gemma_batch("run", sample_jsonl, "--output", sample_jsonl)
    assert same.returncode == 2 and "is the input file" in same.stderr
    assert sample_jsonl.read_bytes() == (SAMPLES / "prompts.jsonl").read_bytes()
    for flags, fragment in ((("--max-batch", "0"), "--max-batch 0: must be >= 1 (default 32)"),
                            (("--top-k", "-1"), "--top-k must be >= 0"),
                            (("--max-step-tokens", "4", "--max-batch", "8"), "--max-step-tokens 4: must be at least --max-batch"),
                            (("--weights", "int3"), "(default auto)"),
                            (("--keep-columns", "row"), "--keep-columns row: name(s) clash")):
        bad = gemma_batch("run", sample_jsonl, *flags)
        assert bad.returncode == 2 and fragment in bad.stderr, bad.stderr
    table, lines = tmp_path / "t.parquet", tmp_path / "t.jsonl"
    pq.write_table(pa.table({"prompt": ["a"], "id": ["x"]}), table)
    lines.write_text('{"prompt": "a", "id": "x"}\n')
    for flag, value in (("--keep-columns", "nosuch"), ("--id-column", "nosuch"), ("--prompt-column", "nosuch")):
        for source in (table, lines):  # (JSON Lines: a key of no row)
            missing = gemma_batch("run", source, flag, value)
            assert missing.returncode == 2 and flag in missing.stderr and "'prompt', 'id'" in missing.stderr, missing.stderr


def test_a_corrupt_model_fails_fast_naming_the_file(tmp_path, sample_jsonl):
    model = Path(shutil.copytree(DEMO_MODEL, tmp_path / "model"))
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    done = gemma_batch("run", sample_jsonl, "--model", model)
    assert done.returncode == 2 and "model.safetensors" in done.stderr
    assert not sample_jsonl.with_name("prompts.jsonl.completions.parquet").exists()


def test_resuming_with_other_settings_is_refused_unless_forced(tmp_path, sample_jsonl):
    assert gemma_batch("run", sample_jsonl, "--max-tokens", "4").returncode == 0
    changed = gemma_batch("run", sample_jsonl, "--max-tokens", "5")
    assert changed.returncode == 2 and "max_tokens" in changed.stderr and "--force" in changed.stderr
    forced = gemma_batch("run", sample_jsonl, "--max-tokens", "5", "--force")
    assert forced.returncode == 0, forced.stderr
    assert {r["max_tokens"] for r in read_rows(sample_jsonl.with_name("prompts.jsonl.completions.parquet"))} == {5}


def test_a_locked_output_is_refused(sample_jsonl):
    with OutputLock(sample_jsonl.with_name("prompts.jsonl.completions.parquet")):
        done = gemma_batch("run", sample_jsonl)
    assert done.returncode == 1 and "another gemma-batch run" in done.stderr


def test_a_toml_job_resolves_paths_beside_it_and_flags_override_it(tmp_path, sample_jsonl):
    spec = tmp_path / "jobs" / "job.toml"
    spec.parent.mkdir()
    spec.write_text('input = "../prompts.jsonl"\noutput = "../out.parquet"\nmax-tokens = 6\nkeep_columns = ["topic"]\n')
    done = gemma_batch("run", spec, "--max-tokens", "3", cwd=REPO / "tests")
    assert done.returncode == 0, done.stderr
    rows = read_rows(tmp_path / "out.parquet")
    assert {r["max_tokens"] for r in rows} == {3} and rows[0]["topic"] == "story"
    stats = read_rows(tmp_path / "out.stats.parquet")[0]  # paths said without jobs/..
    assert (stats["input"], stats["output"]) == (str(tmp_path / "prompts.jsonl"), str(tmp_path / "out.parquet"))
    spec.write_text('input = "../prompts.jsonl"\nmax_tokenz = 6\n')
    bad = gemma_batch("run", spec)
    assert bad.returncode == 2 and "max_tokenz" in bad.stderr


def test_a_csv_input_runs_as_its_jsonl_twin_and_a_txt_input_is_refused(tmp_path):
    """The reported case: `run in.csv` read each line as JSON and failed every row, exit 0."""
    rows = [{"id": "a", "prompt": "The sea, and all that in it is", "topic": "sea"},
            {"id": "b", "prompt": 'He said, "Let there be light"', "topic": "light"}]
    write_jsonl(tmp_path / "in.jsonl", rows)
    (tmp_path / "in.csv").write_text('id,prompt,topic\na,"The sea, and all that in it is",sea\n'
                                     'b,"He said, ""Let there be light""",light\n')
    for name in ("in.jsonl", "in.csv"):
        done = gemma_batch("run", tmp_path / name, "--max-tokens", "6", "--backend", "cpu", "--keep-columns", "topic")
        assert done.returncode == 0 and "0 failed" in done.stdout, done.stderr
    csv_rows, jsonl_rows = (read_rows(tmp_path / f"{name}.completions.parquet") for name in ("in.csv", "in.jsonl"))
    drop = ("request_hash",)  # (the same; shown for clarity that nothing else differs)
    assert [{k: v for k, v in r.items() if k not in drop} for r in csv_rows] == \
           [{k: v for k, v in r.items() if k not in drop} for r in jsonl_rows]
    (tmp_path / "in.txt").write_text("The sea\nOnce upon a time\n")
    txt = gemma_batch("run", tmp_path / "in.txt")
    assert txt.returncode == 2 and "cannot tell its format from its name (.txt)" in txt.stderr
    assert "model:" not in txt.stderr and not (tmp_path / "in.txt.completions.parquet").exists()


def test_a_float32_checkpoint_is_labelled_fp32(tmp_path, sample_jsonl):
    """The weights a job ran with are named as they are: the demo model widened to float32 runs
    as fp32 (the same completions: bf16 values widen exactly), in the log, the statistics and
    `inspect`; `inspect` names the KV storage of the backend it is asked about."""
    from safetensors.numpy import save_file

    model = Path(shutil.copytree(DEMO_MODEL, tmp_path / "fp32"))
    raw = (model / "model.safetensors").read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header, data = json.loads(raw[8: 8 + size]), raw[8 + size:]
    widened = {}
    for name, entry in header.items():
        if name != "__metadata__":
            begin, end = entry["data_offsets"]
            assert entry["dtype"] in ("BF16", "F32")
            values = np.frombuffer(data[begin:end], "<u2" if entry["dtype"] == "BF16" else "<f4")
            values = (values.astype(np.uint32) << 16).view(np.float32) if entry["dtype"] == "BF16" else values
            widened[name] = values.reshape(entry["shape"])
    save_file(widened, model / "model.safetensors")
    outputs = {}
    for name, where in (("bf16", DEMO_MODEL), ("fp32", model)):
        out = tmp_path / f"{name}.parquet"
        done = gemma_batch("run", sample_jsonl, "--model", where, "--backend", "cpu", "--max-tokens", "8", "--output", out)
        assert done.returncode == 0 and f"weights {name}\n" in done.stderr, done.stderr
        assert read_rows(tmp_path / f"{name}.stats.parquet")[0]["weights"] == name
        outputs[name] = [r["completion"] for r in read_rows(out)]
    assert outputs["fp32"] == outputs["bf16"]
    for backend, kv in (("cpu", "fp32"), ("vulkan", "fp16")):
        shown = gemma_batch("inspect", model, "--backend", backend)
        assert shown.returncode == 0 and "weights fp32: " in shown.stdout and f"KV {kv}: " in shown.stdout, shown.stderr


def test_the_bundled_job_spec_is_valid():
    from gemma_batch.job.job_file import load_toml
    from gemma_batch.job.spec import make_spec

    spec = make_spec(load_toml(REPO / "jobs" / "label-sentiment.toml"))
    assert spec.input.exists() and spec.keep_columns == ("topic",)


def test_openai_batch_round_trip(tmp_path):
    src = Path(shutil.copy(SAMPLES / "openai_batch.jsonl", tmp_path / "batch.jsonl"))
    done = gemma_batch("run", src, "--output-format", "openai")
    assert done.returncode == 0, done.stderr
    requests = [json.loads(line) for line in src.read_text().splitlines()]
    results = [json.loads(line) for line in (tmp_path / "batch.jsonl.results.jsonl").read_text().splitlines()]
    assert [r["custom_id"] for r in results] == [q["custom_id"] for q in requests]
    parquet = gemma_batch("run", src, "--output", tmp_path / "same.parquet")
    assert parquet.returncode == 0, parquet.stderr
    for request, result, row in zip(requests, results, read_rows(tmp_path / "same.parquet")):
        assert result["error"] is None and result["response"]["status_code"] == 200
        body = result["response"]["body"]
        assert body["usage"]["completion_tokens"] == row["completion_tokens"] <= request["body"]["max_tokens"]
        if request["url"] == "/v1/chat/completions":
            assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"] == row["completion"]
        else:
            assert body["object"] == "text_completion" and body["choices"][0]["text"] == row["completion"]
            assert row["temperature"] == request["body"]["temperature"]
    again = gemma_batch("run", src, "--output-format", "openai")
    assert again.returncode == 0 and "already complete" in again.stderr


def test_sampled_rows_are_the_same_alone_batched_and_shuffled(tmp_path):
    prompts = [{"id": f"r{i}", "prompt": f"Story number {i}: once upon a time" + " and then" * (i % 7)} for i in range(20)]
    flags = ("--temperature", "0.9", "--top-p", "0.95", "--seed", "7", "--max-tokens", "24")
    a = write_jsonl(tmp_path / "a.jsonl", prompts)
    b = write_jsonl(tmp_path / "b.jsonl", [prompts[i] for i in (7, 3, 19, 0, 11, 5, 2, 18, 1, 9, 4, 6, 8, 10, 12, 13, 14, 15, 16, 17)])
    assert gemma_batch("run", a, *flags, "--max-batch", "1").returncode == 0
    assert gemma_batch("run", b, *flags, "--max-batch", "32", "--max-step-tokens", "40").returncode == 0
    alone = {r["id"]: r["completion"] for r in read_rows(tmp_path / "a.jsonl.completions.parquet")}
    shuffled = {r["id"]: r["completion"] for r in read_rows(tmp_path / "b.jsonl.completions.parquet")}
    assert alone == shuffled
    assert len(set(alone.values())) > 1


def test_a_small_kv_budget_lowers_the_context_with_a_notice_and_still_finishes(tmp_path, sample_jsonl):
    roomy = gemma_batch("run", sample_jsonl, "--max-tokens", "40", "--output", tmp_path / "roomy.parquet")
    tight = gemma_batch("run", sample_jsonl, "--max-tokens", "40", "--kv-memory", "200KiB",
                        "--max-model-len", "96", "--output", tmp_path / "tight.parquet")
    assert roomy.returncode == 0 and tight.returncode == 0, tight.stderr
    assert "notice: max model length lowered from 96 to 64 tokens" in tight.stderr and "--kv-memory" in tight.stderr
    stats = read_rows(tmp_path / "tight.stats.parquet")[0]
    assert stats["preemptions"] > 0
    by_id = {r["id"]: r for r in read_rows(tmp_path / "roomy.parquet")}
    rows = read_rows(tmp_path / "tight.parquet")
    assert all(r["prompt_tokens"] + r["completion_tokens"] <= 64 for r in rows)
    same_length = [r for r in rows if r["completion_tokens"] == by_id[r["id"]]["completion_tokens"]]
    assert len(same_length) >= len(rows) // 2  # rows the lower context did not cut are unchanged
    assert all(r["completion"] == by_id[r["id"]]["completion"] for r in same_length)


def test_a_job_killed_at_random_moments_resumes_to_the_same_file(tmp_path):
    import random
    import signal
    import time

    constraints = [{}, {"regex": "[a-z ]{1,30}"}, {"json_schema": {"type": "object", "properties": {"n": {"type": "integer"}}}},
                   {"choices": [" sunny", " cold and wet", " warm"]}]
    prompts = [{"id": f"k{i}", "prompt": f"Row {i}: the weather today" + " is" * (i % 11), **constraints[i % 4]}
               for i in range(120)]  # (constrained and scored rows too: they start over on a resume)
    src = write_jsonl(tmp_path / "kill.jsonl", prompts)
    flags = ("--temperature", "0.8", "--top-k", "50", "--max-tokens", "40", "--max-batch", "8")
    reference = gemma_batch("run", src, *flags, "--output", tmp_path / "reference.parquet")
    assert reference.returncode == 0, reference.stderr

    def resumed_with_rows(err: str) -> bool:
        return any(f"of {len(prompts)} rows already done" in line and not line.startswith("resuming: 0 ")
                   for line in err.splitlines())

    target = tmp_path / "killed.parquet"
    rng = random.Random(3)
    resumed_midway = 0
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-m", "gemma_batch", "run", str(src), *flags, "--output", str(target)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        partial = target.with_name(target.name + ".partial")
        deadline = time.monotonic() + 60
        while not partial.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # kill only once the job has started writing, at a random moment after
        if not resumed_midway:  # until one kill has landed after a commit, wait for a committed row
            journal = partial / "pending.jsonl"
            while proc.poll() is None and time.monotonic() < deadline and not (
                    journal.exists() and b"\n" in journal.read_bytes()) and not any(partial.glob("part-*")):
                time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.8))
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate()
        resumed_midway += resumed_with_rows(err)
        if target.exists():
            break
    final = gemma_batch("run", src, *flags, "--output", target)
    assert final.returncode == 0, final.stderr
    resumed_midway += resumed_with_rows(final.stderr)
    assert resumed_midway > 0  # some kill landed after rows were committed
    assert target.read_bytes() == (tmp_path / "reference.parquet").read_bytes()


def test_quantized_weights_are_converted_once_then_read_from_the_cache(tmp_path, sample_jsonl, monkeypatch):
    monkeypatch.setenv("GEMMA_BATCH_CACHE_DIR", str(tmp_path / "cache"))
    flags = ("--weights", "int8", "--max-tokens", "8", "--backend", "cpu")
    first = gemma_batch("run", sample_jsonl, *flags)
    assert first.returncode == 0, first.stderr
    assert "backend: cpu (chosen with --backend); weights int8-g32" in first.stderr and "weights converted to int8-g32" in first.stderr
    again = gemma_batch("run", sample_jsonl, *flags, "--output", tmp_path / "again.parquet")
    assert again.returncode == 0 and "int8-g32 weights read from the cache" in again.stderr, again.stderr
    rows = read_rows(tmp_path / "prompts.jsonl.completions.parquet")
    assert rows == read_rows(tmp_path / "again.parquet")

    other = gemma_batch("run", sample_jsonl, "--weights", "int4", "--max-tokens", "8", "--backend", "cpu")
    assert other.returncode == 2 and "params.weights" in other.stderr and "--force" in other.stderr
    vulkan = gemma_batch("run", sample_jsonl, *flags[:-1], "vulkan", "--output", tmp_path / "v.parquet")
    assert vulkan.returncode == 0 and "int8-g32 weights read from the cache" in vulkan.stderr, vulkan.stderr
    assert len(read_rows(tmp_path / "v.parquet")) == len(rows)
    bad = gemma_batch("run", sample_jsonl, "--weights", "int3", "--output", tmp_path / "b.parquet")
    assert bad.returncode == 2 and "weights 'int3'" in bad.stderr


def test_an_int4_job_records_its_calibration_and_refuses_another(tmp_path, sample_jsonl, monkeypatch):
    """int4's rounding is weighted by a calibration text (quantize/calibration.py): the weights'
    label carries its digest, so resuming under another text (or none) is refused, and a bad text
    stops the job before anything is written, naming the file."""
    monkeypatch.setenv("GEMMA_BATCH_CACHE_DIR", str(tmp_path / "cache"))
    flags = ("--weights", "int4", "--max-tokens", "4", "--backend", "cpu", "--output", tmp_path / "out.parquet")
    first = gemma_batch("run", sample_jsonl, *flags)
    assert first.returncode == 0, first.stderr
    assert "int4 grid weighted by" in first.stderr and "tokens of the bundled text" in first.stderr
    label = pq.read_table(tmp_path / "out.stats.parquet").column("weights")[0].as_py()
    assert label.startswith("int4-g32+min8 weighted:")
    text = write_jsonl(tmp_path / "calibration.txt", ["Another text to weigh the rounding by."] * 20)
    other = gemma_batch("run", sample_jsonl, *flags, env={"GEMMA_BATCH_CALIBRATION": str(text)})
    assert other.returncode == 2 and "params.weights" in other.stderr, other.stderr
    missing = gemma_batch("run", sample_jsonl, *flags[:-1], tmp_path / "m.parquet",
                          env={"GEMMA_BATCH_CALIBRATION": str(tmp_path / "nowhere.txt")})
    assert missing.returncode == 2 and "nowhere.txt" in missing.stderr and not (tmp_path / "m.parquet").exists()


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_signal_stops_at_a_step_boundary_and_the_rerun_completes_the_same_file(tmp_path, signum):
    """The first SIGTERM / SIGINT: the job stops at the next step with its finished rows saved,
    says so and exits 128 + the signal (143 / 130); the same command again finishes the file,
    byte-identical to an uninterrupted run. A second signal exits at once with that code."""
    import signal
    import time

    prompts = [{"id": f"s{i}", "prompt": f"Row {i}: the harbour at dawn" + " and" * (i % 7)} for i in range(60)]
    src = write_jsonl(tmp_path / "sig.jsonl", prompts)
    flags = ("--max-tokens", "48", "--max-batch", "4")
    reference = gemma_batch("run", src, *flags, "--output", tmp_path / "reference.parquet")
    assert reference.returncode == 0, reference.stderr
    target = tmp_path / "stopped.parquet"
    sig = getattr(signal, signum)

    def start() -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "gemma_batch", "run", str(src), *flags, "--output", str(target)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        journal, deadline = target.with_name(target.name + ".partial") / "pending.jsonl", time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline and not (
                journal.exists() and journal.read_bytes().count(b"\n") >= 2):
            time.sleep(0.005)  # (a committed row or two: rows are running)
        return proc

    proc = start()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert f"stopped by {signum}" in err and "run the same command again to resume" in err
    assert not target.exists()
    proc = subprocess.Popen([sys.executable, "-m", "gemma_batch", "run", str(src), *flags, "--output", str(target)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # it resumes (the job catches signals from its start: before, Python's defaults rule)
        if line.startswith("resuming:"):
            break
    proc.send_signal(sig)  # two signals in a row: out at once
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig
    final = gemma_batch("run", src, *flags, "--output", target)
    assert final.returncode == 0, final.stderr
    assert "rows already done" in final.stderr
    assert target.read_bytes() == (tmp_path / "reference.parquet").read_bytes()


def test_default_output_names_keep_the_whole_input_name(tmp_path):
    """No two inputs share a default output: two parts of one dataset, one stem in two formats, a
    file and its compressed copy (test_output_ownership.py runs them)."""
    from gemma_batch.job.spec import make_spec

    def default_output(name: str, **extra) -> str:
        return make_spec({"input": tmp_path / name, **extra}, where="test").output_path.name

    names = ["data.part1.jsonl", "data.part2.jsonl", "data.jsonl", "data.parquet", "data.csv", "data.jsonl.gz", "README"]
    assert [default_output(name) for name in names] == [f"{name}.completions.parquet" for name in names]
    assert default_output("batch.v2.jsonl", output_format="openai") == "batch.v2.jsonl.results.jsonl"


def test_the_output_format_follows_the_output_name(tmp_path):
    """.parquet, .jsonl and .csv hold the same rows (CSV: lists as JSON text, nulls empty); another
    extension, or one that contradicts --output-format, is a usage error before anything runs; a
    binary kept column cannot go to CSV; a finished .csv or .jsonl job is complete on a rerun."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "The sea"}, {"id": "b", "prompt": None},
                                             {"id": "c", "prompt": "Once", "stop": ["\n"]}])
    outputs = {ext: tmp_path / f"out{ext}" for ext in (".parquet", ".jsonl", ".csv")}
    for ext, out in outputs.items():
        done = gemma_batch("run", src, "--max-tokens", "4", "--output", out)
        assert done.returncode == 0 and "1 failed" in done.stdout, done.stderr
    rows = read_rows(outputs[".parquet"])
    assert [json.loads(line) for line in outputs[".jsonl"].read_text().splitlines()] == rows
    with outputs[".csv"].open(newline="") as f:
        table = list(__import__("csv").DictReader(f))
    assert [r["id"] for r in table] == ["a", "b", "c"] and table[2]["stop"] == '["\\n"]' and table[1]["completion"] == ""
    assert [r["completion"] or None for r in table] == [r["completion"] for r in rows]
    again = gemma_batch("run", src, "--max-tokens", "4", "--output", outputs[".csv"])
    assert again.returncode == 0 and "already complete" in again.stderr
    for bad in (("--output", tmp_path / "out.txt"), ("--output", tmp_path / "o.parquet", "--output-format", "jsonl"),
                ("--output", tmp_path / "o.parquet", "--output-format", "openai")):
        refused = gemma_batch("run", src, *bad)
        assert refused.returncode == 2 and "--output" in refused.stderr, refused.stderr
    blob = tmp_path / "blob.parquet"
    pq.write_table(pa.table({"prompt": ["x"], "raw": pa.array([b"\xff"], pa.binary())}), blob)
    refused = gemma_batch("run", blob, "--keep-columns", "raw", "--output", tmp_path / "blob.csv")
    assert refused.returncode == 2 and "raw" in refused.stderr and "CSV" in refused.stderr


def test_a_full_disk_mid_job_says_where_and_that_a_rerun_resumes(tmp_path, monkeypatch):
    """A write that fails mid-job (here the journal, as on a full disk) fails the job (exit 1) naming
    the file and the rows kept; the same command then resumes from them. An output folder the job
    cannot write in fails before the model loads."""
    import errno
    import io

    from gemma_batch.job import journal, runner
    from gemma_batch.job.spec import make_spec

    src = write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": f"Row {i}"} for i in range(20)])
    out = tmp_path / "out.parquet"
    real, calls = journal.Journal.append, []

    def append(self, line):
        calls.append(line)
        if len(calls) > 5:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        real(self, line)

    monkeypatch.setattr(journal.Journal, "append", append)
    spec = make_spec({"input": src, "output": out, "max_tokens": 4, "backend": "cpu"})
    with pytest.raises(runner.JobFailed) as failed:
        runner.run_job(spec, log=io.StringIO(), out=io.StringIO())
    message = str(failed.value)
    assert "pending.jsonl: No space left on device" in message and "the 5 finished rows are kept" in message
    assert "resumes" in message
    monkeypatch.undo()
    done = gemma_batch("run", src, "--max-tokens", "4", "--backend", "cpu", "--output", out)
    assert done.returncode == 0 and "resuming: 5 of 20 rows already done" in done.stderr, done.stderr
    unwritable = gemma_batch("run", src, "--output", "/proc/out.parquet")
    assert unwritable.returncode == 2 and "cannot write in the output folder /proc" in unwritable.stderr
    assert "model:" not in unwritable.stderr  # before the model loads


def test_an_output_dir_holds_the_rows_of_the_one_file_output_as_parts(tmp_path, sample_jsonl):
    flags = ("--max-tokens", "6")
    assert gemma_batch("run", sample_jsonl, *flags, "--output", tmp_path / "one.parquet").returncode == 0
    folder = tmp_path / "labels-{date}"
    done = gemma_batch("run", sample_jsonl, *flags, "--output-dir", folder)
    assert done.returncode == 0, done.stderr
    [written] = [p for p in tmp_path.glob("labels-2*") if p.is_dir()]
    assert sorted(p.name for p in written.iterdir()) == ["_job.json", "part-000000000000-000000000012.parquet"]
    one = pq.read_table(tmp_path / "one.parquet")
    assert pq.read_table(written).equals(one.replace_schema_metadata(None))
    assert json.loads((written / "_job.json").read_text())["params"]["output_format"] == "parquet-dir"
    again = gemma_batch("run", sample_jsonl, *flags, "--output-dir", folder)
    assert again.returncode == 0 and "already complete" in again.stderr
    other = gemma_batch("run", sample_jsonl, "--max-tokens", "3", "--output-dir", folder, "--force")
    assert other.returncode == 0 and pq.read_table(written).column("completion_tokens").to_pylist() == [3] * 12
    assert not list(tmp_path.glob("*.tmp-*")) and not list(tmp_path.glob("*.partial"))
