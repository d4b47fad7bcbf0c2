"""`gemma-batch generate`, `convert`, `devices` and `bench`: quick completions, a GGUF as a Hugging
Face folder, the devices, the engine's speed."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from ..backends.kv_formats import KV_DTYPES
from ..backends.npu_device import find_npus
from ..backends.vulkan.device import list_devices
from ..backends.vulkan.errors import DeviceMemoryError, VulkanUnavailable
from ..bench.report import format_table, write_json
from ..bench.runner import BenchError, BenchOptions, run_bench
from ..bench.shapes import SHAPES
from ..engine.llm import LLM
from ..job.spec import DEMO_MODEL
from ..model.gguf_convert import convert as gguf_convert
from ..model.quant import FORMATS_HELP, WeightFormat


def generate(
    prompts: list[str] = typer.Argument(..., help="Prompts to complete, computed together as one batch."),
    model: Path = typer.Option(DEMO_MODEL, help="A Hugging Face Gemma 3 folder, a .gguf file, gemma-3-270m or a Hugging Face name (as `run --model`)."),
    max_tokens: int = typer.Option(32, min=1, help="Most new tokens per prompt."),
    chat: bool = typer.Option(False, "--chat", metavar="", help="Wrap each prompt as a user turn in the Gemma 3 chat template."),
    backend: str = typer.Option("auto", help="Device backend: auto, cpu or vulkan; auto takes Vulkan when a GPU is present (as `run` does)."),
    device: str = typer.Option(None, help="Vulkan device: index or part of its name (see `gemma-batch devices`)."),
) -> None:
    """Complete PROMPTS greedily and print one completion per prompt."""
    try:
        llm = LLM(model, backend=backend, device=device)
    except (OSError, ValueError) as e:  # a missing or bad model, a bad flag
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except (VulkanUnavailable, DeviceMemoryError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    inputs = [[{"role": "user", "content": p}] for p in prompts] if chat else list(prompts)
    for prompt, completion in zip(prompts, llm.generate(inputs, max_tokens=max_tokens)):
        typer.echo(f"{prompt!r} -> {completion!r}")


def convert(
    gguf_file: Path = typer.Argument(..., metavar="FILE.gguf", show_default=False, help="A Gemma 3 GGUF file (llama.cpp's format)."),
    folder: Path = typer.Argument(..., metavar="DIR", show_default=False, help="The Hugging Face folder to write; it must not exist."),
) -> None:
    """Write a Gemma 3 GGUF as a Hugging Face folder (config.json, model.safetensors with its quantized
    blocks carried as gemma-batch's int8 / int4, tokenizer.model) that gemma-batch loads; `run --model
    FILE.gguf` does this once by itself. (transformers reads the GGUF itself, with gguf_file=.)"""
    if folder.exists():
        typer.echo(f"error: {folder} exists; name a new folder", err=True)
        raise typer.Exit(2)
    if not gguf_file.is_file():
        typer.echo(f"error: {gguf_file} does not exist", err=True)
        raise typer.Exit(2)
    try:
        gguf_convert(gguf_file, folder)
    except ValueError as e:  # (GGUFError)
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"wrote {folder}")


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



def bench(
    shape: str = typer.Option("1b", help=f"Gemma 3 shape, random weights (no checkpoint): {', '.join(SHAPES)}."),
    model: str = typer.Option(None, help="A real model to time instead of --shape: a folder, a .gguf file, "
                              "gemma-3-270m or a Hugging Face name, as run --model takes it."),
    weights: str = typer.Option("auto", help=FORMATS_HELP),
    int4_group: int = typer.Option(32, help="Weights per int4 scale and minimum: 32 or 64."),
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
    """Time the engine on a real Gemma 3 shape (or a real model): prefill and decode tokens/s, time to first token,
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
    options = BenchOptions(shape, batches, prompt_len, gen_len, backend, device, bandwidth_bytes, seed, fmt, kv_dtype,
                           place, model)
    try:
        report = run_bench(options, command=shlex.join(["gemma-batch", *sys.argv[1:]]))
    except (BenchError, ValueError, OSError, VulkanUnavailable, DeviceMemoryError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(format_table(report))
    if json_path is not None:
        write_json(report, json_path)
