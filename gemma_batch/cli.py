"""The `gemma-batch` command line: parses options and calls the engine or the job, nothing else.

Exit codes of `run`: 0 success, 2 usage error (bad flag, TOML or value; a job in progress with
other settings), 1 job failure (unreadable input or model, no memory, a locked output; and row
errors when --fail-on-row-error is given), 143 / 130 stopped by SIGTERM / SIGINT (finished rows
saved, a rerun resumes: job/signals.py). `bench`: 0, 2 for a bad flag, 1 when it cannot run.
"""

from __future__ import annotations

import importlib.metadata
import shlex
import sys
from pathlib import Path

import numpy as np
import typer

from .bench.report import format_table, write_json
from .bench.runner import BenchError, BenchOptions, run_bench
from .backends.kv_formats import KV_DTYPES, kv_slot_bytes
from .bench.report import binary_size
from .bench.shapes import SHAPES, shape_config
from .backends.npu_device import find_npus
from .backends.placement import ACTIVATION_BYTES, Placement, parse_placement
from .engine.footprint import Footprint, auto_placement, footprint, placed_bytes
from .model.checkpoint import Checkpoint
from .model.config import Gemma3Config
from .model.quant import WeightFormat
from .bench.random_weights import layout as random_layout
from .data.rows import ColumnNotFound, DatasetError
from .backends.vulkan.device import list_devices
from .backends.vulkan.errors import DeviceMemoryError, VulkanUnavailable
from .engine.kv_plan import KVBudgetError
from .engine.llm import LLM
from .job.lock import JobLocked
from .job.runner import JobFailed, JobStopped, run_job
from .job.spec import DEMO_MODEL, UsageError, check_paths, load_toml, make_spec, parse_size
from .job.store import JobMismatch

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False, help="Batch text generation with Gemma 3 models.")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gemma-batch {importlib.metadata.version('gemma-batch')}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    """Batch text generation with Gemma 3 models."""


@app.command()
def generate(
    prompts: list[str] = typer.Argument(..., help="Prompts to complete, computed together as one batch."),
    model: Path = typer.Option(DEMO_MODEL, help="A Hugging Face Gemma 3 directory (config.json, safetensors, tokenizer.model)."),
    max_tokens: int = typer.Option(32, min=1, help="Most new tokens per prompt."),
    chat: bool = typer.Option(False, help="Wrap each prompt as a user turn in the Gemma 3 chat template."),
    backend: str = typer.Option("auto", help="Device backend: auto, cpu or vulkan; auto takes Vulkan when a GPU is present (as `run` does)."),
    device: str = typer.Option(None, help="Vulkan device: index or part of its name (see `gemma-batch devices`)."),
) -> None:
    """Complete PROMPTS greedily and print one completion per prompt."""
    try:
        llm = LLM(model, backend=backend, device=device)
    except (OSError, ValueError, VulkanUnavailable, DeviceMemoryError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    inputs = [[{"role": "user", "content": p}] for p in prompts] if chat else list(prompts)
    for prompt, completion in zip(prompts, llm.generate(inputs, max_tokens=max_tokens)):
        typer.echo(f"{prompt!r} -> {completion!r}")


@app.command()
def devices() -> None:
    """List the Vulkan devices (driver, memory heaps, fp16/int8/bf16, subgroup size, cooperative
    matrix), then the XRT NPUs, or why there is none."""
    npus, why_not = find_npus()
    npu_lines = [f"NPU {i}: {name} (XRT)" for i, name in enumerate(npus)] + ([f"NPU: none ({why_not})"] if why_not else [])
    try:
        found = list_devices()
    except VulkanUnavailable as e:
        typer.echo("\n".join(npu_lines))
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    if not found:
        typer.echo("no Vulkan device found; --backend cpu runs without one")
    for info in found:
        typer.echo(info.describe())
    typer.echo("\n".join(npu_lines))


def _opt(help: str, *names: str) -> typer.models.OptionInfo:
    return typer.Option(None, *names, help=help, show_default=False)


@app.command()
def run(
    source: Path = typer.Argument(..., help="Prompt dataset (.jsonl, .parquet, OpenAI batch .jsonl) or a job spec (.toml)."),
    output: Path = _opt("Output file; its extension (.parquet, .jsonl, .csv) sets the format; {date} in its name becomes today's date (YYYY-MM-DD). [default: INPUT's name less its last suffix (and .gz / .zst) + .completions.parquet (.results.jsonl for openai), beside it]"),
    output_dir: Path = _opt("Instead of one file, a folder of Parquet parts in row order (4,096 rows each; its `_job.json` records the job), for large jobs; {date} as in --output."),
    model: Path = _opt("A Hugging Face Gemma 3 directory. [default: the bundled demo model]"),
    backend: str = _opt("Device backend: auto, cpu or vulkan; auto takes Vulkan when a GPU is present and says what it picked. [default: auto]"),
    device: str = _opt("Vulkan device: index or part of its name, as `gemma-batch devices` lists them (or GEMMA_BATCH_VK_DEVICE). [default: a discrete GPU, then an integrated one, then any]"),
    place: str = _opt("Run the model across devices: layer ranges (`0-17:vulkan:0,18-33:vulkan:1`), parts of every layer (`attention=cpu,ffn=vulkan:0`), both, or auto: as many layers as fit on each GPU, the rest on the CPU. [default: auto under --backend auto: the whole model on one GPU where it fits]"),
    gpu_memory: str = _opt("The most memory the job may use on a GPU (6GiB), for weights, KV and step buffers; --place auto splits a model that does not fit in it. [default: what is free]"),
    weights: str = _opt("Weight format: bf16, fp16, int8 (a scale per output channel) or int4 (a scale per group); converted at load and cached (GEMMA_BATCH_CACHE_DIR). [default: bf16]"),
    int4_group: int = _opt("Weights per int4 scale: 32 or 64. [default: 32]"),
    kv_dtype: str = _opt("KV cache storage: fp32, fp16, bf16 or int8 (a scale per token and head). [default: fp32 on cpu, fp16 on vulkan]"),
    prompt_column: str = _opt("Column holding the prompt text. [default: prompt]"),
    id_column: str = _opt("Column holding a unique row id. [default: id if present, else the row number]"),
    keep_columns: list[str] = _opt("Input column to copy into the output (repeatable)."),
    chat: bool = typer.Option(None, "--chat/--no-chat", show_default=False, help="--chat wraps plain prompts as a user turn; --no-chat refuses `messages` rows. [default: chat template for `messages` rows only]"),
    output_format: str = _opt("parquet, jsonl, csv, or openai (OpenAI Batch result lines, to a .jsonl name). [default: the --output name's extension, else parquet]"),
    max_tokens: int = _opt("Most new tokens per row. [default: 256]"),
    temperature: float = _opt("Sampling temperature; 0 is greedy. [default: 0]"),
    top_k: int = _opt("Sample among the k most likely tokens; 0 is off. [default: 0]"),
    top_p: float = _opt("Nucleus sampling mass; 1 is off. [default: 1]"),
    min_p: float = _opt("Drop tokens below min_p x the top probability; 0 is off. [default: 0]"),
    seed: int = _opt("Job seed; a row's randomness depends only on (seed, row id, step). [default: 0]"),
    stop: list[str] = _opt("Stop string, not included in the output (repeatable)."),
    logprobs: int = _opt("Report each generated token's log-probability and the K most likely alternatives (0 to 20) in the `logprobs` column: the model's distribution after a --regex/--json mask, before --temperature and the filters."),
    regex: str = _opt("Every completion matches this regular expression, whole (a row's `regex` column overrides it)."),
    json_schema: Path = _opt("A JSON schema file: every completion is JSON valid under it (a row's `json_schema` column overrides it)."),
    json: bool = typer.Option(False, "--json", help="Every completion is a JSON object."),
    choices: str = _opt("Labels between commas (\"positive,negative\"): each row's answer is the most probable one (a draw under --temperature > 0), with every label's probability in `choice_logprobs`; a row's `choices` column overrides them."),
    score_only: bool = typer.Option(False, "--score-only", help="Only the labels' probabilities (`choice_logprobs`, from --choices or a `choices` column): no answer is picked, `completion` stays null and `finish_reason` is `scored`; a row without choices is an error row."),
    max_batch: int = _opt("Most sequences running at once. [default: 32]"),
    max_model_len: int = _opt("Bound on prompt + completion tokens. [default: the model's context]"),
    kv_memory: str = _opt("KV cache memory: a size (4GiB, 512MB) or a share of free memory (50%). [default: 50%]"),
    block_size: int = _opt("Tokens per KV block. [default: 16]"),
    max_step_tokens: int = _opt("Token budget of one step (prefill is chunked to it). [default: the backend's: 8192 on GPUs with cooperative matrices, else 512]"),
    prefix_cache: bool = typer.Option(None, "--prefix-cache/--no-prefix-cache", show_default=False, help="Compute a prompt start that rows share (an instruction, few-shot examples) once and reuse its KV cache; completions are the same either way. [default: --prefix-cache]"),
    force: bool = typer.Option(False, "--force", help="Start over when the output belongs to a job with other settings."),
    fail_on_row_error: bool = typer.Option(False, "--fail-on-row-error", help="Exit 1 when any row failed (the output is still written)."),
    ray: bool = typer.Option(False, "--ray", help="Run on a Ray cluster's workers, each with the whole model on its GPU (or CPU): the same output as a local run. Needs `pip install gemma-batch[ray]`."),
    ray_address: str = _opt("With --ray: the cluster's address (auto: the one `ray start` made on this machine; ray://HOST:10001). [default: RAY_ADDRESS, else a new cluster on this machine]"),
    workers: int = _opt("With --ray: how many workers. [default: one per GPU of the cluster, else one per machine on its CPUs]"),
) -> None:
    """Complete every row of a prompt dataset into a Parquet dataset, resumably.

    Run the same command again after a crash or kill to resume: finished rows are kept.
    """
    flags = {"force": force, "fail_on_row_error": fail_on_row_error, "json": json, "ray": ray}
    given = {k: v for k, v in locals().items() if k not in ("source", "flags", *flags) and v not in (None, [])}
    given |= {k: True for k, v in flags.items() if v}
    try:
        settings = load_toml(source) if source.suffix == ".toml" else {"input": source}
        spec = make_spec({**settings, **given}, where=str(source) if source.suffix == ".toml" else "command line")
        check_paths(spec)
        stats = _run_ray(spec) if spec.ray else run_job(spec)
    except (UsageError, JobMismatch, ColumnNotFound) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except (JobFailed, JobLocked, DatasetError, KVBudgetError, OSError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    except JobStopped as e:  # SIGTERM or SIGINT while rows ran: finished rows committed
        typer.echo(str(e), err=True)
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt:
        typer.echo("interrupted: finished rows are saved; run the same command again to resume", err=True)
        raise typer.Exit(130) from None
    if spec.fail_on_row_error and stats.get("rows_failed", 0):
        typer.echo(f"error: {stats['rows_failed']} row(s) failed (--fail-on-row-error)", err=True)
        raise typer.Exit(1)


def _run_ray(spec) -> dict:
    """The job on Ray (ray_data/job.py); a UsageError where Ray is not installed."""
    try:
        from .ray_data.job import run_ray_job
    except ImportError as e:
        raise UsageError(f"--ray needs Ray Data: pip install 'gemma-batch[ray]' ({e})") from None
    return run_ray_job(spec, spec.ray_address, spec.workers)


@app.command()
def inspect(
    model: str = typer.Argument(..., help=f"A Hugging Face Gemma 3 directory, or a shape name ({', '.join(s for s in SHAPES if s != 'tiny')}) for its bf16 checkpoint."),
    weights: str = typer.Option("bf16", help="Weight format: bf16, fp16, int8 or int4."),
    int4_group: int = typer.Option(32, help="Weights per int4 scale: 32 or 64."),
    kv_dtype: str = typer.Option("fp16", help="KV cache storage: fp32, fp16, bf16 or int8."),
    memory: str = typer.Option(None, help="Device memory budget (16GiB, 8GB) to plan sequences in."),
    seq_len: int = typer.Option(2048, min=1, help="Tokens per sequence (prompt + completion)."),
    batch: int = typer.Option(32, min=1, help="Sequences to check against --memory."),
    max_step_tokens: int = typer.Option(512, min=1, help="Prefill chunk (sliding-window layers hold the window plus one); a job's is 8192 on GPUs with cooperative matrices, 512 elsewhere."),
    place: str = typer.Option(None, help="A placement plan across devices, as `0-17:vulkan:0,18-33:vulkan:1` or `attention=cpu,ffn=vulkan:0` (items `[LAYERS:][attention|ffn|embed|head=]DEVICE`), or `auto` (with --memory: the layers that fit on vulkan:0, the rest on cpu): print each device's weights and KV and the activations crossing between them."),
) -> None:
    """Print what MODEL takes in a weight format and KV dtype, and how many sequences fit in --memory."""
    try:
        fmt = WeightFormat.parse(weights, int4_group)
        kv_slot_bytes(kv_dtype, 1, 1)
        if model in SHAPES and not Path(model).is_dir():
            cfg, where = shape_config(model), f"{model} shape"
            layout = random_layout(cfg)
        else:
            cfg, where = Gemma3Config.from_dir(Path(model)), model
            layout = Checkpoint.open(Path(model), cfg).layout
        budget = None if memory is None else parse_size(memory, 0)
        if place == "auto" and budget is None:
            raise ValueError("--place auto needs --memory: the budget of the GPU (vulkan:0) that takes the first layers")
        placement = None if place in (None, "auto") else parse_placement(place, cfg.num_layers)
    except (OSError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    fp = footprint(cfg, layout, fmt, kv_dtype)
    params = sum(int(np.prod(shape)) for _, shape in layout.values())
    typer.echo(f"model: {where}: {cfg.num_layers} layers, hidden {cfg.hidden_size}, {cfg.num_heads}/{cfg.num_kv_heads} "
               f"heads of {cfg.head_dim}, vocab {cfg.vocab_size}; {params / 1e9:.2f} B parameters")
    parts = ", ".join(f"{kind} {binary_size(n)}" for kind, n in sorted(fp.weight_bytes.items(), key=lambda kv: -kv[1]))
    typer.echo(f"weights {fmt}: {binary_size(fp.total_weight_bytes)} ({parts})")
    groups = ", ".join(f"{g.name} {binary_size(fp.kv_bytes_per_token[g.name])} over {len(g.layers)} layers"
                       + (f" (window {g.window})" if g.window else "") for g in cfg.kv_groups())
    typer.echo(f"KV {kv_dtype}: {binary_size(sum(fp.kv_bytes_per_token.values()))} per token ({groups})")
    seq = fp.sequence_bytes(seq_len, max_chunk=max_step_tokens)
    typer.echo(f"one sequence of {seq_len} tokens reserves {binary_size(seq)} of KV")
    if place == "auto":
        placement = auto_placement(fp, layout, [("vulkan:0", budget)], seq_len, batch, max_chunk=max_step_tokens)
        typer.echo(f"--place auto: as many layers as fit in {binary_size(budget)} on vulkan:0 with {batch} sequences "
                   f"of {seq_len} tokens, the rest on cpu")
    if placement is not None:
        _print_placement(fp, placement, layout, seq_len, batch, max_step_tokens)
    if budget is not None:
        fits = fp.sequences_that_fit(budget, seq_len, max_chunk=max_step_tokens)
        need = fp.total_weight_bytes + batch * seq
        verdict = "fits" if fits >= batch else f"does not fit: {fits} do"
        typer.echo(f"in {binary_size(budget)}: {batch} sequences of {seq_len} tokens need {binary_size(need)} "
                   f"(weights and KV, before step buffers): {verdict}")
        if fits >= batch:
            blocks, starts = fp.prefix_room(budget, batch, seq_len, max_chunk=max_step_tokens)
            typer.echo(f"beside them: {blocks} prefix-cache blocks of 16 tokens (every layer's K/V), or {starts} cached "
                       f"prompt starts of {seq_len} tokens (of which the sliding layers keep the last window)")


def _print_placement(fp: Footprint, placement: Placement, layout: dict, seq_len: int, batch: int, max_step_tokens: int) -> None:
    """`inspect --place`: the plan, each device's share, and what crosses between devices."""
    typer.echo(f"placement: {placement.describe()} (sizes as a GPU holds them; the CPU backend widens bf16 and "
               f"fp16 weights to float32)")
    for device, (weights, kv) in placed_bytes(fp, placement, layout, seq_len, max_chunk=max_step_tokens).items():
        typer.echo(f"  {device}: weights {binary_size(weights)}, KV {binary_size(kv)} a sequence of {seq_len} tokens "
                   f"({binary_size(weights + batch * kv)} with {batch} of them)")
    crossings = placement.crossings()
    per_token = len(crossings) * fp.cfg.hidden_size * ACTIVATION_BYTES
    where = ", ".join(f"{name} ({a} -> {b})" for name, a, b in crossings[:4]) + (", ..." if len(crossings) > 4 else "")
    typer.echo(f"crossings: {len(crossings)} a step{': ' + where if crossings else ''}; {binary_size(per_token)} of "
               f"activations a token ({binary_size(per_token * batch)} a decode step of {batch})")


@app.command()
def bench(
    shape: str = typer.Option("1b", help=f"Gemma 3 shape, random weights (no checkpoint): {', '.join(SHAPES)}."),
    weights: str = typer.Option("bf16", help="Weight format: bf16, fp16, int8 or int4 (which keeps the embedding int8)."),
    int4_group: int = typer.Option(32, help="Weights per int4 scale: 32 or 64."),
    kv_dtype: str = typer.Option(None, help="KV cache storage: fp32, fp16, bf16 or int8. [default: fp32 on cpu, fp16 on vulkan]"),
    batch: str = typer.Option("1,8,32", help="Batch sizes, comma-separated; one case each."),
    prompt_len: int = typer.Option(128, help="Prompt tokens per request."),
    gen_len: int = typer.Option(128, help="Tokens generated per request (exactly: there is no stop token)."),
    backend: str = typer.Option("auto", help="Device backend: auto, cpu or vulkan."),
    device: str = typer.Option(None, help="Vulkan device: index or part of its name (see `gemma-batch devices`)."),
    place: str = typer.Option(None, help="A placement plan across devices, as `run --place` takes it (no auto); instead of --backend and --device."),
    bandwidth_bytes: int = typer.Option(1 << 30, help="Buffer size of the read-bandwidth measurement (capped by the device)."),
    json_path: Path = typer.Option(None, "--json", help="Also write the report as JSON to this file."),
    seed: int = typer.Option(0, help="Seed of the random weights and prompts."),
) -> None:
    """Time the engine on a real Gemma 3 shape: prefill and decode tokens/s, time to first token,
    host time per step, peak device memory, and the fraction of the measured bandwidth decode reaches."""
    if shape not in SHAPES:
        raise typer.BadParameter(f"{shape!r} is not one of {', '.join(SHAPES)}", param_hint="--shape")
    try:
        batches = tuple(int(b) for b in batch.split(","))
    except ValueError:
        raise typer.BadParameter(f"{batch!r}: expected comma-separated integers like 1,8,32", param_hint="--batch") from None
    try:
        fmt = WeightFormat.parse(weights, int4_group)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--weights/--int4-group") from None
    if kv_dtype is not None and kv_dtype not in KV_DTYPES:
        raise typer.BadParameter(f"{kv_dtype!r} is not one of {', '.join(KV_DTYPES)}", param_hint="--kv-dtype")
    options = BenchOptions(shape, batches, prompt_len, gen_len, backend, device, bandwidth_bytes, seed, fmt, kv_dtype, place)
    try:
        report = run_bench(options, command=shlex.join(["gemma-batch", *sys.argv[1:]]))
    except (BenchError, ValueError, VulkanUnavailable, DeviceMemoryError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(format_table(report))
    if json_path is not None:
        write_json(report, json_path)
