"""The command line and the Python API end to end on the bundled demo model."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from gemma_batch import LLM
from gemma_batch.cli import DEMO_MODEL
from gemma_batch.engine.generate import generate_greedy

GEMMA_BATCH = [sys.executable, "-m", "gemma_batch"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*GEMMA_BATCH, *args], capture_output=True, text=True, timeout=120)


def test_generate_on_the_demo_model_prints_one_completion_per_prompt():
    done = run_cli("generate", "The sea", "Once upon a time", "--max-tokens", "8")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("'The sea' -> ") and lines[1].startswith("'Once upon a time' -> ")


def test_cli_output_equals_the_python_api_and_greedy_driver():
    llm = LLM(DEMO_MODEL)
    prompts = ["The sea", "Once upon a time"]
    texts = llm.generate(prompts, max_tokens=8)
    done = run_cli("generate", *prompts, "--max-tokens", "8")
    assert done.stdout.splitlines() == [f"{p!r} -> {t!r}" for p, t in zip(prompts, texts)]
    # Each prompt alone gives the same greedy ids as the batch: batching does not change results.
    stop = frozenset(llm.config.eos_token_ids)
    together = generate_greedy(llm.backend, [llm.encode(p) for p in prompts], 8, stop)
    alone = [generate_greedy(llm.backend, [llm.encode(p)], 8, stop)[0] for p in prompts]
    assert together == alone


def test_chat_prompts_use_the_template():
    llm = LLM(DEMO_MODEL)
    ids = llm.encode([{"role": "user", "content": "Hi"}])
    # <bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n (exact ids: test_tokenizer.py)
    assert ids[:2] == [2, 105] and ids.count(105) == 2 and ids.count(106) == 1
    done = run_cli("generate", "--chat", "Hi", "--max-tokens", "4")
    assert done.returncode == 0, done.stderr


def test_a_missing_model_directory_fails_with_its_name(tmp_path):
    """A usage error (exit 2), said as such: not "config.json not found"."""
    for command in (("generate", "x"), ("run", str(DEMO_MODEL.parent / "prompts.jsonl"))):
        done = run_cli(*command, "--model", str(tmp_path / "nope"))
        assert done.returncode == 2 and f"model directory {tmp_path / 'nope'} does not exist" in done.stderr, done.stderr
    (tmp_path / "empty").mkdir()
    empty = run_cli("generate", "x", "--model", str(tmp_path / "empty"))
    assert empty.returncode == 2 and f"config.json not found in {tmp_path / 'empty'}" in empty.stderr


def test_a_model_without_tokenizer_fails_with_the_file_named(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(DEMO_MODEL, model)
    os.remove(model / "tokenizer.model")
    done = run_cli("generate", "x", "--model", str(model))
    assert done.returncode == 2 and "tokenizer.model" in done.stderr and str(model) in done.stderr


def test_inspect_plans_the_27b_shape_in_int4_with_an_int8_kv_cache():
    """Sizes worked out here from the published 27B shape, independently of the code."""
    h, i, layers, nh, nkv, hd, vocab = 5376, 21504, 62, 32, 16, 128, 262208
    matrices = [(nh * hd, h), (nkv * hd, h), (nkv * hd, h), (h, nh * hd), (i, h), (i, h), (h, i)]
    # min8: a row's low 4 bits, then 4 bytes of steps, int5's fifth bits, a 2-byte pair per group, padded to 4
    # bytes; 5-bit codes for q/k/v (groups of 64) and gate/up (128), 4-bit for o and down (32)
    formats = [(5, 64), (5, 64), (5, 64), (4, 32), (5, 128), (5, 128), (4, 32)]
    int4 = layers * sum(n * (k // 2 + -(-(4 + (k // 8 if bits == 5 else 0) + 2 * k // group) // 4) * 4)
                        for (n, k), (bits, group) in zip(matrices, formats))
    embed_int8 = vocab * h + 2 * vocab * h // 32  # the tied LM head stays int8, an fp16 scale per 32
    norms = 2 * (layers * (4 * h + 2 * hd) + h)
    weights = int4 + embed_int8 + norms
    per_token_layer = 2 * (nkv * hd + 4 * nkv * hd // 32)  # K and V: int8 values and an fp32 scale per 32 of them
    global_layers, sliding_layers = 10, 52
    # 2048 tokens in 16-token blocks; a sliding layer holds window - 1 + chunk (512) tokens, +1 block
    seq = per_token_layer * 16 * (global_layers * 128 + sliding_layers * (-(-(1024 - 1 + 512) // 16) + 1))
    fit = (18 * 2**30 - weights) // seq
    done = run_cli("inspect", "27b", "--weights", "int4", "--kv-dtype", "int8", "--memory", "18GiB")
    assert done.returncode == 0, done.stderr
    assert f"weights int4-g32+min8: {weights / 2**30:.1f} GiB" in done.stdout
    assert f"KV int8: {(global_layers + sliding_layers) * per_token_layer / 1024:.1f} KiB per token" in done.stdout
    assert f"reserves {seq / 2**20:.1f} MiB" in done.stdout
    assert f"does not fit: {fit} do" in done.stdout and fit == 4
    # beside 3 of them in 20 GiB, the prefix cache: blocks of every layer, or 2048-token prompt starts
    # (every global block, the sliding layers' last window: ceil(1023 / 16) + 1 = 65 blocks)
    free = 20 * 2**30 - weights - 3 * seq
    prefix = per_token_layer * 16 * (global_layers * 128 + sliding_layers * 65)
    roomy = run_cli("inspect", "27b", "--weights", "int4", "--kv-dtype", "int8", "--memory", "20GiB", "--batch", "3")
    assert f"beside them: {free // (16 * per_token_layer * 62)} prefix-cache blocks" in roomy.stdout
    assert f"or {free // prefix} cached prompt starts of 2048 tokens" in roomy.stdout
    bad = run_cli("inspect", "27b", "--weights", "int3")
    assert bad.returncode == 2 and "int3" in bad.stderr


def test_run_help_groups_the_options_and_shows_every_default():
    """Panels by concern, every option's default (the ones the issue names checked by value), no
    `<bool>` beside switches, a plain usage line, and text kept literal (`gemma-batch[ray]`)."""
    done = subprocess.run([*GEMMA_BATCH, "run", "--help"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "400"})
    assert done.returncode == 0, done.stderr
    text = done.stdout
    for panel in ("Input and output", "Model and device", "Sampling", "Constrained answers", "Batching and memory",
                  "Job control", "Ray"):
        assert f"─ {panel} ─" in text
    options = {line.split()[1]: line for line in text.splitlines() if line.startswith("│ --")}
    for flag, default in (("--max-tokens", "256"), ("--max-batch", "32"), ("--block-size", "16"),
                          ("--model", "the bundled demo model"), ("--kv-memory", "50%"), ("--weights", "auto"),
                          ("--temperature", "0.0"), ("--prompt-column", "prompt"), ("--backend", "auto")):
        assert f"[default: {default}]" in options[flag], options[flag]
    switches = {"--json", "--score-only", "--force", "--input-renamed", "--fail-on-row-error", "--ray", "--help"}
    assert [flag for flag, line in options.items() if flag not in switches and "[default: " not in line] == []
    assert "<bool>" not in text and " run [OPTIONS] INPUT " in text and "{" not in text.split("\n")[1]
    assert "pip install 'gemma-batch[ray]'" in text
    top = run_cli("--help")
    assert top.returncode == 0 and "<bool>" not in top.stdout and "--version" in top.stdout


def test_inspect_names_its_own_flag_in_errors():
    bad = run_cli("inspect", "4b", "--memory", "lots")
    assert bad.returncode == 2 and "--memory 'lots'" in bad.stderr and "--kv-memory" not in bad.stderr


def test_version_and_a_non_finite_temperature():
    """`--version` prints the installed version; an infinite or NaN temperature is a usage error
    (exit 2) before anything loads."""
    import importlib.metadata

    done = run_cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"gemma-batch {importlib.metadata.version('gemma-batch')}"
    for value in ("inf", "nan"):
        prompts = Path(__file__).resolve().parent.parent / "sample_data" / "prompts.jsonl"
        bad = run_cli("run", str(prompts), "--temperature", value, "--output", "/tmp/never.parquet")
        assert bad.returncode == 2 and "temperature must be finite" in bad.stderr, bad.stderr


def test_the_cache_command_lists_what_is_cached_and_clears_it(tmp_path):
    """What a run caches is listed by part with its size; --clear removes the parts (and nothing else
    in the folder); the cache off is said."""
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "a.safetensors").write_bytes(b"x" * 3 * 2**20)
    (tmp_path / "gguf" / "f-v2").mkdir(parents=True)
    (tmp_path / "gguf" / "f-v2" / "model.safetensors").write_bytes(b"y" * 2**20)
    (tmp_path / "tuning.json").write_text("{}")
    (tmp_path / "mine.txt").write_text("not gemma-batch's")
    env = {**os.environ, "GEMMA_BATCH_CACHE_DIR": str(tmp_path)}
    listed = subprocess.run([*GEMMA_BATCH, "cache"], capture_output=True, text=True, env=env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert f"{tmp_path / 'weights'}: 3.0 MiB in 1 entry" in listed.stdout and f"{tmp_path / 'gguf'}: 1.0 MiB" in listed.stdout
    assert "4.0 MiB in all" in listed.stdout and f"{tmp_path / 'tuning.json'}: 0.0 MiB in 1 entry" in listed.stdout
    cleared = subprocess.run([*GEMMA_BATCH, "cache", "--clear"], capture_output=True, text=True, env=env, timeout=60)
    assert "removed 4.0 MiB" in cleared.stdout and sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]
    empty = subprocess.run([*GEMMA_BATCH, "cache"], capture_output=True, text=True, env=env, timeout=60)
    assert "nothing cached" in empty.stdout
    off = subprocess.run([*GEMMA_BATCH, "cache"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "GEMMA_BATCH_CACHE_DIR": "off"})
    assert "the cache is off" in off.stdout
