"""The prompt tile's form per matmul shape, timed on the device and kept in the cache.

The prompt tile (matmul_coop.comp WHOLE_K, fp16 tiles on fp16 inputs) comes in the forms of
`coop_tiles.PROMPT_FORMS`, which give the same bits, so the choice changes speed alone. A backend
with cooperative matrices on fp16 inputs (`tuned`) reads this device's choices from
`<cache>/tuning.json`. It times the model's shapes that are not there and writes them back:
each form at TUNE_ROWS prompt rows (a whole prefill step: at 2,048 or 4,096 rows, whose inputs stay
in the H200's L2, the 2x4 form timed 4-8% faster on 4b's down projection, and a job that ran it
1.4% slower), after a warm-up round, then the best of REPEATS rounds taken in turn. An H200's
first 4b backend took 3.5 s with it, 0.2 s once kept (the forms' kernels compiled included). A
choice is kept per device, driver, tile order and the forms' SPIR-V (`device_key`), so a new build
of the kernels is timed again. `gemma-batch tune` times them again and prints the table
(`time_forms`, `format_times`).

GEMMA_BATCH_VK_TUNE=0 keeps the default form everywhere and times nothing; so does a run
without a cache (GEMMA_BATCH_CACHE_DIR=off), whose choice could not be kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np

from ...startup import phase
from ...switches import switched_on
from .coop_tiles import (COOP_FOLD_ROWS, COOP_FOLD_TILE_ROWS, COOP_WIDE_COLS, DEFAULT_PROMPT_FORM, PROMPT_FORMS, coop_variant,
                         prompt_shape_key)
from .errors import DeviceMemoryError
from .kernels import META_BINDING, Kernels
from .memory import Memory
from .step_buffers import PREFILL_STEP_TOKENS
from .variants import VARIANTS
from .timestamps import best_dispatch_seconds

if TYPE_CHECKING:
    from ...model.config import Gemma3Config

TUNE_ENV = "GEMMA_BATCH_VK_TUNE"
FILE = "tuning.json"
TUNE_ROWS = PREFILL_STEP_TOKENS  # prompt rows each form is timed at
REPEATS = 3  # rounds of every form after the warm-up round; each form keeps its best
Shape = tuple[int, int, bool]  # (N, K, gated): N the matmul's outputs (gate and up together where gated)


def model_shapes(cfg: Gemma3Config) -> list[Shape]:
    """The shapes of `cfg`'s layer matmuls that run the 128-output prompt tile: q/k/v, o,
    gate/up, down (those of a multiple of COOP_WIDE_COLS outputs; coop_tiles.coop_fold)."""
    H, I = cfg.hidden_size, cfg.intermediate_size
    shapes = [(cfg.q_width + 2 * cfg.kv_width, H, False), (H, cfg.q_width, False), (2 * I, H, True), (H, I, False)]
    return [shape for shape in dict.fromkeys(shapes) if shape[0] % COOP_WIDE_COLS == 0]


def device_key(kernels: Kernels) -> str:
    """What a choice holds for: the device, its driver, how the weight tiles are stored, and the
    forms' kernels (a digest of their SPIR-V) timed at TUNE_ROWS rows."""
    info = kernels.dev.info
    digest = hashlib.sha256()
    for gemm in ((), ("GATED",)):
        for form in PROMPT_FORMS:
            digest.update(VARIANTS[coop_variant(gemm, "T16", "wide", whole=True, form=form)].spv.read_bytes())
    return (f"{info.name} | {info.driver} | fragment order {'on' if kernels.fragment_loads else 'off'} | "
            f"kernels {digest.hexdigest()[:12]} at {TUNE_ROWS} rows")


def wanted(root: Path | None) -> bool:
    """The user's switch (GEMMA_BATCH_VK_TUNE=0: no tuning), and a cache to keep the choice in."""
    return root is not None and switched_on(TUNE_ENV)


def read_choices(path: Path, key: str, log: TextIO) -> dict[str, str]:
    """The forms kept for device `key` at `path` (shape key -> form); none where the file is
    missing, and none with a note on `log` where it cannot be read (it is timed again and
    written anew)."""
    try:
        kept = json.loads(path.read_text()).get(key, {})
        return {shape: entry["form"] for shape, entry in kept.items() if entry["form"] in PROMPT_FORMS}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, AttributeError, KeyError, TypeError) as e:
        print(f"note: {path} could not be read ({e}); the prompt tile's forms are timed again", file=log)
        return {}


def fastest(by_form: dict[str, float]) -> str:
    """The form of least time in `by_form` (form -> seconds)."""
    return min(by_form, key=by_form.get)


def write_choices(path: Path, key: str, times: dict[str, dict[str, float]]) -> None:
    """Add the fastest form of each timed shape to device `key`'s entries at `path` (replaced
    whole, so a reader never sees half a file)."""
    try:
        kept = json.loads(path.read_text())
        kept = kept if isinstance(kept, dict) else {}
    except (OSError, ValueError):
        kept = {}
    entries = kept.get(key) if isinstance(kept.get(key), dict) else {}
    for shape, by_form in times.items():
        entries[shape] = {"form": fastest(by_form), "ms": {f: round(1e3 * s, 4) for f, s in by_form.items()}}
    kept[key] = entries
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(kept, indent=1, sort_keys=True))
    tmp.replace(path)


def time_forms(kernels: Kernels, mem: Memory, shapes: list[Shape], rows: int = TUNE_ROWS,
               repeats: int = REPEATS) -> dict[str, dict[str, float]]:
    """GPU seconds of each prompt-tile form on each shape (shape key -> form -> best of `repeats`
    rounds), at `rows` prompt rows of random fp16 weights and inputs."""
    times: dict[str, dict[str, float]] = {}
    for N, K, gated in shapes:
        gemm = ("GATED",) if gated else ()
        w = _random(mem, (N // 2 if gated else N) * K, "tuning weights")
        x = _random(mem, rows * 2 * K, "tuning inputs")  # split rows [hi K | lo K]; fp16 inputs read hi
        part = mem.alloc(rows * N * 4, "tuning sums")
        meta = mem.uploaded(np.array([rows, 1, 0, 0, 0, 0, 0, 0], np.uint32), "tuning step header")
        try:
            dset = kernels.descriptor_set({0: w, 1: x, 2: part, 4: w, META_BINDING: meta}, part)
            push = {"N": N, "K": K, "kchunk": K, "group": 0, "fold_rows": COOP_FOLD_ROWS}
            groups = -(-rows // COOP_FOLD_TILE_ROWS) * (N // COOP_WIDE_COLS)
            names = {form: coop_variant(gemm, "T16", "wide", whole=True, form=form) for form in PROMPT_FORMS}
            best = {form: float("inf") for form in PROMPT_FORMS}
            for round_ in range(repeats + 1):  # round 0 warms the clocks and builds the pipelines
                for form, name in names.items():
                    seconds = best_dispatch_seconds(kernels, name, dset, push, groups, 1)
                    if round_:
                        best[form] = min(best[form], seconds)
            times[prompt_shape_key(N, K, gated)] = best
        finally:
            for buf in (w, x, part, meta):
                mem.free(buf)
    return times


def _random(mem: Memory, halves: int, label: str):
    """A buffer of `halves` random fp16 values (a block of them repeated)."""
    buf = mem.alloc(2 * halves, label)
    block = np.random.default_rng(0).standard_normal(min(halves, 1 << 22)).astype(np.float16)
    for start in range(0, halves, block.size):
        mem.upload(buf, block[: min(block.size, halves - start)], offset=2 * start)
    return buf


def tuned(kernels: Kernels, mem: Memory, cfg: Gemma3Config, root: Path | None, log: TextIO = sys.stderr) -> Kernels:
    """`kernels` with `prompt_forms` set for `cfg`'s shapes where the prompt tile's form matters
    (cooperative matrices on fp16 inputs) and the user allows it (`wanted`): kept choices read
    from `root`'s FILE, the others timed now and added to it."""
    if not (kernels.dev.coopmat and not kernels.x_lo and wanted(root)):
        return kernels
    path, key = root / FILE, device_key(kernels)
    choices = read_choices(path, key, log)
    missing = [shape for shape in model_shapes(cfg) if prompt_shape_key(*shape) not in choices]
    if missing:
        try:
            with phase("tuning the prompt tile"):
                times = time_forms(kernels, mem, missing)
        except DeviceMemoryError as e:  # (a device short of memory runs the default form)
            print(f"note: the prompt tile's forms were not timed ({e}); the default form runs", file=log)
            times = {}
        try:
            if times:
                write_choices(path, key, times)
        except OSError as e:  # (a cache that cannot be written: timed again next time)
            print(f"note: the prompt tile's forms could not be kept in {path} ({e})", file=log)
        choices.update({shape: fastest(by_form) for shape, by_form in times.items()})
    kernels.prompt_forms = {shape: form for shape, form in choices.items() if form != DEFAULT_PROMPT_FORM}
    return kernels


def format_times(times: dict[str, dict[str, float]]) -> str:
    """The table `gemma-batch tune` prints: ms per form and shape, the fastest marked."""
    forms = list(PROMPT_FORMS)
    lines = [f"{'matmul (N x K)':22s}" + "".join(f"{form:>12s}" for form in forms) + "   fastest"]
    for shape, by_form in times.items():
        best = fastest(by_form)
        lines.append(f"{shape:22s}" + "".join(f"{1e3 * by_form[f]:11.3f}{'*' if f == best else ' '}" for f in forms)
                     + f"   {best}")
    return "\n".join(lines)
