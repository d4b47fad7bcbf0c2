"""`gemma-batch cache`: what gemma-batch keeps in its cache folder, and emptying it."""

from __future__ import annotations

import shutil
from pathlib import Path

import typer

from ..model.quant_cache import cache_root

# What each part of the cache folder holds (model/sources.py, model/gguf_convert.py, model/quant_cache.py,
# backends/vulkan/tuning.py).
PARTS = {
    "models": "models assembled from their packages (gemma-3-270m)",
    "gguf": "GGUF files converted to Hugging Face folders (their blocks carried)",
    "weights": "checkpoints converted to --weights int8 / int4",
    "tuning.json": "the prompt tile's fastest form per GPU, driver, kernel build and matmul shape (gemma-batch tune)",
}


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def cache(clear: bool = typer.Option(False, "--clear", metavar="",
                                     help="Remove what gemma-batch cached (a later run converts again, once).")) -> None:
    """List what gemma-batch cached to start faster (GEMMA_BATCH_CACHE_DIR moves it; `off` turns it
    off), or remove it with --clear. Nothing in it is needed: a run makes again what is missing."""
    root = cache_root()
    if root is None:
        typer.echo("the cache is off (GEMMA_BATCH_CACHE_DIR=off): conversions are made again by every run")
        return
    found = {name: root / name for name in PARTS if (root / name).exists()}
    if not found:
        typer.echo(f"{root}: nothing cached")
        return
    total = 0
    for name, path in found.items():
        size = _size(path)
        total += size
        entries = sum(1 for p in path.iterdir() if p.name != "digests.json") if path.is_dir() else 1
        typer.echo(f"{path}: {size / 2**20:,.1f} MiB in {entries} entr{'y' if entries == 1 else 'ies'}: {PARTS[name]}")
    if clear:
        for path in found.values():
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        typer.echo(f"removed {total / 2**20:,.1f} MiB from {root}")
    else:
        typer.echo(f"{total / 2**20:,.1f} MiB in all; `gemma-batch cache --clear` removes it")
