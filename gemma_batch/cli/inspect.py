"""`gemma-batch inspect`: what a model takes in memory, how many sequences fit, and (--verify)
whether its checkpoint holds values no trained Gemma holds."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import typer

from ..backends import default_kv_dtype, resolve_backend
from ..backends.kv_formats import kv_slot_bytes
from ..backends.placement import ACTIVATION_BYTES, Placement, parse_placement
from ..bench.random_weights import layout as random_layout
from ..bench.report import binary_size
from ..bench.shapes import SHAPES, shape_config
from ..engine.footprint import Footprint, auto_placement, footprint, placed_bytes
from ..job.model_setup import open_model
from ..job.spec import parse_size
from ..model import verify
from ..model.quant import FORMATS_HELP, WeightFormat, weights_label
from .help import text


def inspect(
    model: str = typer.Argument(..., show_default=False, help=text(
        f"A model as `run --model` takes it (a folder, a .gguf file, gemma-3-270m, a Hugging Face name), or a shape "
        f"name ({', '.join(s for s in SHAPES if s != 'tiny')}) for its bf16 checkpoint.")),
    weights: str = typer.Option("auto", help=text(FORMATS_HELP)),
    int4_group: int = typer.Option(32, help=text("Weights per int4 scale and minimum: 32 or 64.")),
    backend: str = typer.Option("auto", help=text("The backend whose KV cache storage is the default: auto (as `run` "
                                                   "picks), cpu (fp32) or vulkan (fp16).")),
    kv_dtype: str = typer.Option(None, show_default=False, help=text("KV cache storage: fp32, fp16, bf16 or int8.",
                                                                      "the backend's")),
    memory: str = typer.Option(None, show_default=False, help=text("Device memory budget (16GiB, 8GB) to plan "
                                                                    "sequences in.", "none")),
    seq_len: int = typer.Option(2048, min=1, help=text("Tokens per sequence (prompt + completion).")),
    batch: int = typer.Option(32, min=1, help=text("Sequences to check against --memory.")),
    max_step_tokens: int = typer.Option(512, min=1, help=text(
        "Prefill chunk (sliding-window layers hold the window plus one); a job's is 8192 on GPUs with cooperative "
        "matrices, 512 elsewhere.")),
    place: str = typer.Option(None, show_default=False, help=text(
        "A placement plan across devices, as `0-17:vulkan:0,18-33:vulkan:1` or `attention=cpu,ffn=vulkan:0` (items "
        "`[LAYERS:][attention|ffn|embed|head=]DEVICE`), or `auto` (with --memory: the layers that fit on vulkan:0, the "
        "rest on cpu): print each device's weights and KV and the activations crossing between them.")),
    verify_values: bool = typer.Option(False, "--verify", metavar="", help=text(
        "Read every tensor of the checkpoint and report those holding NaN, infinities or magnitudes beyond fp16's "
        "range (a damaged file); exit 1 if any does.")),
) -> None:
    """Print what MODEL takes in a weight format and KV dtype, and how many sequences fit in --memory."""
    checkpoint = None
    try:
        fmt = WeightFormat.parse(weights, int4_group)
        kv_dtype = kv_dtype or default_kv_dtype(resolve_backend(backend)[0])
        kv_slot_bytes(kv_dtype, 1, 1)
        if model in SHAPES and not Path(model).is_dir():
            cfg, where = shape_config(model), f"{model} shape"
            layout = random_layout(cfg)
        else:
            _, cfg, _, checkpoint = open_model(Path(model), sys.stderr)
            where, layout = model, checkpoint.layout
        budget = None if memory is None else parse_size(memory, 0, "--memory")
        if place == "auto" and budget is None:
            raise ValueError("--place auto needs --memory: the budget of the GPU (vulkan:0) that takes the first layers")
        placement = None if place in (None, "auto") else parse_placement(place, cfg.num_layers)
    except (OSError, ValueError) as e:  # (UsageError is a ValueError)
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if verify_values and checkpoint is None:
        typer.echo(f"error: --verify reads a checkpoint; {model} is a shape name", err=True)
        raise typer.Exit(2)
    fp = footprint(cfg, layout, fmt, kv_dtype)
    params = sum(int(np.prod(shape)) for _, shape in layout.values())
    typer.echo(f"model: {where}: {cfg.num_layers} layers, hidden {cfg.hidden_size}, {cfg.num_heads}/{cfg.num_kv_heads} "
               f"heads of {cfg.head_dim}, vocab {cfg.vocab_size}; {params / 1e9:.2f} B parameters")
    parts = ", ".join(f"{kind} {binary_size(n)}" for kind, n in sorted(fp.weight_bytes.items(), key=lambda kv: -kv[1]))
    typer.echo(f"weights {weights_label(fmt, layout)}: {binary_size(fp.total_weight_bytes)} ({parts})")
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
        _print_fit(fp, budget, seq_len, seq, batch, max_step_tokens)
    if verify_values:
        _verify(checkpoint)


def _print_fit(fp: Footprint, budget: int, seq_len: int, seq: int, batch: int, max_step_tokens: int) -> None:
    """`inspect --memory`: whether `batch` sequences fit, and the prefix cache's room beside them."""
    fits = fp.sequences_that_fit(budget, seq_len, max_chunk=max_step_tokens)
    need = fp.total_weight_bytes + batch * seq
    verdict = "fits" if fits >= batch else f"does not fit: {fits} do"
    typer.echo(f"in {binary_size(budget)}: {batch} sequences of {seq_len} tokens need {binary_size(need)} "
               f"(weights and KV, before step buffers): {verdict}")
    if fits >= batch:
        blocks, starts = fp.prefix_room(budget, batch, seq_len, max_chunk=max_step_tokens)
        typer.echo(f"beside them: {blocks} prefix-cache blocks of 16 tokens (every layer's K/V), or {starts} cached "
                   f"prompt starts of {seq_len} tokens (of which the sliding layers keep the last window)")


def _verify(checkpoint) -> None:
    """`inspect --verify`: every tensor read; the ones out of bounds listed (exit 1), or none."""
    problems = list(verify.scan(checkpoint))
    for problem in problems:
        typer.echo(f"damaged: {problem.describe()}")
    if problems:
        typer.echo(f"error: {len(problems)} of {len(checkpoint.names)} tensors hold NaN, infinite or out-of-range "
                   "values: the checkpoint is damaged; replace it", err=True)
        raise typer.Exit(1)
    typer.echo(f"verified: all {len(checkpoint.names)} tensors are finite and within fp16's range")


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
