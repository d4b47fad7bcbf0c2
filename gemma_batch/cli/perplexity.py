"""`gemma-batch perplexity`: a model's perplexity on a text, to choose a weight format or KV dtype."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import typer

from ..backends.kv_formats import KV_DTYPES
from ..backends.vulkan.errors import DeviceMemoryError, VulkanUnavailable
from ..engine.llm import LLM
from ..engine.perplexity_report import Reference, Settings, measure, summary
from ..model.quant import FORMATS_HELP, WeightFormat

_DEFAULTS = Settings()


def perplexity(
    text_file: Path = typer.Argument(..., metavar="TEXT_FILE", show_default=False,
                                     help="A UTF-8 text file, scored whole."),
    model: str = typer.Option(..., help="A Hugging Face Gemma 3 folder, a .gguf file, gemma-3-270m or a Hugging Face "
                              "name (as run --model).", show_default=False),
    weights: str = typer.Option("auto", help=FORMATS_HELP),
    int4_group: int = typer.Option(32, help="Weights per int4 scale and minimum: 32 or 64."),
    kv_dtype: str = typer.Option(None, help="KV cache storage: fp32, fp16, bf16 or int8. [default: the backend's]"),
    backend: str = typer.Option("auto", help="Device backend: auto, cpu or vulkan."),
    device: str = typer.Option(None, help="Vulkan device: index or part of its name."),
    context: int = typer.Option(_DEFAULTS.context, min=1, help="Text tokens a window holds (after its <bos>)."),
    stride: int = typer.Option(None, min=1, help="Tokens between window starts; each window scores only the tokens "
                               "no earlier one did. [default: --context: every token once]"),
    reference: str = typer.Option(None, help="Compare with this: an earlier run's --json report, or a model (as "
                                  "--model) run first in --reference-weights; adds the perplexity change, top-1 "
                                  "agreement and mean KL divergence."),
    reference_weights: str = typer.Option("auto", help="The weight format of a --reference model."),
    top_k: int = typer.Option(_DEFAULTS.top_k, min=1, help="Most likely tokens kept per scored token in the report "
                              "(what a later --reference compares with)."),
    max_batch: int = typer.Option(_DEFAULTS.max_batch, min=1, help="Windows run at once."),
    json_path: Path = typer.Option(None, "--json", help="Write the report here (JSON: figures and per-token top-k)."),
) -> None:
    """Score TEXT_FILE with a model: its perplexity in windows (as llama.cpp's llama-perplexity),
    and against a reference the change, top-1 agreement and KL divergence."""
    settings = Settings(context, stride or context, top_k, max_batch)
    try:
        for name in (weights, reference_weights):
            WeightFormat.parse(name, int4_group)
        if kv_dtype is not None and kv_dtype not in KV_DTYPES:
            raise ValueError(f"--kv-dtype {kv_dtype!r} is not one of {', '.join(KV_DTYPES)}")
        if settings.stride > settings.context:
            raise ValueError(f"--stride {settings.stride} is above --context {settings.context}")
        if not text_file.is_file():
            raise ValueError(f"{text_file} does not exist")
        command = shlex.join(["gemma-batch", *sys.argv[1:]])
        ref = None
        if reference is not None:
            ref = Reference.load(Path(reference)) if reference.endswith(".json") else \
                _run_reference(reference, reference_weights, int4_group, kv_dtype, backend, device, text_file, settings)
        llm = LLM(model, backend=backend, device=device, weights=weights, kv_dtype=kv_dtype, int4_group=int4_group)
        report = measure(llm, text_file, settings, ref, command, model)
    except (OSError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except (VulkanUnavailable, DeviceMemoryError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(summary(report))
    if json_path is not None:
        json_path.write_text(json.dumps(report) + "\n", encoding="utf-8")
        typer.echo(f"report: {json_path}")


def _run_reference(model: str, weights: str, int4_group: int, kv_dtype: str | None, backend: str, device: str | None,
                   text_file: Path, settings: Settings) -> Reference:
    """The reference model run first, on the same backend, its device memory given back after."""
    llm = LLM(model, backend=backend, device=device, weights=weights, kv_dtype=kv_dtype, int4_group=int4_group)
    try:
        report = measure(llm, text_file, settings, model=model)
    finally:
        llm.backend.close()
    typer.echo(summary(report), err=True)
    return Reference(f"{model} ({report['weights']})", report)
