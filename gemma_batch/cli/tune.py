"""`gemma-batch tune`: time the prompt tile's forms on a GPU for a model's matmuls and keep the fastest."""

from __future__ import annotations

import sys

import typer

from ..backends.vulkan import fragment_order, tuning
from ..backends.vulkan.device import Device
from ..backends.vulkan.errors import DeviceMemoryError, VulkanUnavailable
from ..backends.vulkan.kernels import Kernels
from ..backends.vulkan.memory import Memory
from ..bench.shapes import SHAPES, shape_config
from ..model.quant_cache import cache_root
from ..model.sources import open_model


def tune(
    model: str = typer.Option(None, help="The model whose matmuls to time: a folder, a .gguf file, gemma-3-270m or a "
                              "Hugging Face name, as run --model takes it."),
    shape: str = typer.Option(None, help=f"Or a Gemma 3 shape: {', '.join(SHAPES)}."),
    device: str = typer.Option(None, help="Vulkan device: index or part of its name (see `gemma-batch devices`)."),
) -> None:
    """Time each form of the prompt tile (the prefill matmul on cooperative matrices; every form
    gives the same results) on the model's matmul shapes, print the table and keep the fastest per
    shape in the cache for this device and driver. A job's first run on a device does this by itself
    for the shapes it needs (GEMMA_BATCH_VK_TUNE=0 turns that off); this command times them again."""
    if (model is None) == (shape is None):
        raise typer.BadParameter("name a model or a shape (one of them)", param_hint="--model/--shape")
    if shape is not None and shape not in SHAPES:
        raise typer.BadParameter(f"{shape!r} is not one of {', '.join(SHAPES)}", param_hint="--shape")
    try:
        cfg = shape_config(shape) if shape is not None else open_model(model, sys.stderr)[1]
    except (OSError, ValueError) as e:  # a missing or bad model
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    try:
        dev = Device(device)
    except VulkanUnavailable as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    mem = Memory(dev)
    kernels = None
    try:
        if not dev.coopmat:
            typer.echo(f"{dev.info.name} has no usable cooperative matrices: its matmuls have one form, nothing to tune")
            return
        kernels = fragment_order.model_kernels(Kernels.for_model(dev, cfg, x_lo=False), mem, cfg)
        times = tuning.time_forms(kernels, mem, tuning.model_shapes(cfg))
        typer.echo(f"{dev.info.name} ({dev.info.driver}): the prompt tile's forms, GPU ms at {tuning.TUNE_ROWS} "
                   f"prompt rows (best of {tuning.REPEATS})")
        typer.echo(tuning.format_times(times))
        root = cache_root()
        if root is None:
            typer.echo("not kept: the cache is off (GEMMA_BATCH_CACHE_DIR)")
        else:
            tuning.write_choices(root / tuning.FILE, tuning.device_key(kernels), times)
            typer.echo(f"kept in {root / tuning.FILE}")
    except DeviceMemoryError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    finally:
        if kernels is not None:
            kernels.close()
        mem.close()
        dev.close()
