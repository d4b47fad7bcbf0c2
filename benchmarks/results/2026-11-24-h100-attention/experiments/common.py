"""What the experiment scripts share: a kernel variant read from another SPIR-V file, builds of
swapped kernels, the median decode step after a 128-token prefill, the logits bits of a few
steps, and the models of the bit-for-bit checks."""
import dataclasses
import hashlib
import time
from pathlib import Path

import numpy as np

from gemma_batch.backends.vulkan import kernels as Kmod
from gemma_batch.backends.vulkan.variants import Variant
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.runner import prefilled_engine
from gemma_batch.bench.shapes import shape_config
from gemma_batch.model.checkpoint import Checkpoint
from gemma_batch.model.config import Gemma3Config


def file_variant(name: str, source: str, path: Path) -> Variant:
    """Variant `name` of shaders/`source`.comp, its SPIR-V read from `path`."""
    class FileVariant(Variant):
        @property
        def spv(self) -> Path:
            return path
    return FileVariant(name, source)


def swap(backend, name: str, path: Path) -> None:
    """Make `backend` build kernel `name` from `path` from now on (its next recording uses it)."""
    Kmod.VARIANTS[name] = file_variant(name, Kmod.VARIANTS[name].source, path)
    backend.kernels.pipelines.pop(name, None)  # (leaks the old pipeline: fine for an experiment)
    backend._drop_graph()


SHIPPED = dict(Kmod.VARIANTS)  # the variants as shipped, before any swap


def parse_builds(spec: str) -> list[tuple[str, list[list[str]]]]:
    """'label:name=file.spv,name=file.spv;label2:...' -> [(label, [[name, file], ...]), ...]."""
    builds = []
    for one in spec.split(";"):
        label, _, swaps = one.partition(":")
        builds.append((label, [s.split("=") for s in swaps.split(",") if s]))
    return builds


def use_build(backend, builds, swaps, here: Path) -> None:
    """Every kernel any of `builds` swaps back to its shipped build, then this build's `swaps`
    (files in `here`)."""
    for name in {n for _, s in builds for n, _ in s}:
        Kmod.VARIANTS[name] = SHIPPED[name]
        backend.kernels.pipelines.pop(name, None)
    for name, spv in swaps:
        swap(backend, name, here / spv)
    backend._drop_graph()


def median_step(backend, batch: int, gen: int, on_step=None) -> float:
    """Median wall seconds of the decode steps of `batch` random 128-token prompts run to `gen`
    tokens, past the first 4; `on_step()` runs after each step, outside the timing."""
    engine, seconds = prefilled_engine(backend, batch, 128, gen), []
    while engine.num_unfinished:
        start = time.perf_counter()
        engine.step()
        seconds.append(time.perf_counter() - start)
        if on_step is not None:
            on_step()
    return float(np.median(seconds[4:]))


def warm(backend, batch: int, seconds: float = 1.0) -> None:
    """Run decode steps of `batch` for `seconds` first, so that the GPU is clocked up (an idle H100
    sits at 345 MHz)."""
    start = time.time()
    while time.time() - start < seconds:
        median_step(backend, batch, 12)


def measure(backend, label: str, batches=(1, 32)) -> None:
    """Print the median decode step (64 new tokens) at each batch size, after 1 s of warm-up each."""
    for batch in batches:
        warm(backend, batch)
        print(f"{label} 4b b{batch}: {median_step(backend, batch, 64) * 1e3:.3f} ms/step", flush=True)


def settings_in_turn(backend, settings, apply, rounds: int = 2) -> None:
    """`rounds` times, each (label, setting) of `settings` in turn: `apply(setting)`, the step
    recorded again, `measure`."""
    for _ in range(rounds):
        for label, setting in settings:
            apply(setting)
            backend._drop_graph()
            measure(backend, label)


def decode_logits(backend, batch: int, gen: int = 7) -> list[np.ndarray]:
    """The logits rows (float32 [batch, V]) of each decode step of `batch` random 128-token prompts
    run to `gen` tokens."""
    engine, V, out = prefilled_engine(backend, batch, 128, gen), backend.cfg.vocab_size, []
    while engine.num_unfinished:
        engine.step()
        out.append(backend.mem.download(backend.buffers.logits, 4 * batch * V).view(np.float32).reshape(batch, V).copy())
    return out


def logits_hashes(backend, batch: int, gen: int = 7) -> list[str]:
    """`decode_logits`, each step's rows hashed (sha1, 12 hex digits)."""
    return [hashlib.sha1(rows.tobytes()).hexdigest()[:12] for rows in decode_logits(backend, batch, gen)]


def alternate(backend, builds, here: Path, rounds: int = 3, before=None) -> None:
    """Print the median 4b decode step (64 new tokens) of each build at batch 1 and 32, the builds
    alternating, `rounds` times, after 1 s of warm-up before each measurement. `before(swaps)`,
    if given, runs before each build is put in place (a setting of the build beside its SPIR-V)."""
    for _ in range(rounds):
        for label, swaps in builds:
            if before is not None:
                before(swaps)
            use_build(backend, builds, swaps, here)
            measure(backend, label)


def backend_4b(**options):
    """A Vulkan backend with random 4b weights (seed 0); `options` go to VulkanBackend."""
    from gemma_batch.backends.vulkan import VulkanBackend
    cfg = shape_config("4b")
    backend = VulkanBackend(cfg, **options)
    backend.load_weights(random_tensors(cfg, 0))
    return backend


def compare_builds(backend, builds, here: Path, before=None) -> None:
    """Each build's 4b logits of 7 decode steps at batch 1 and 32 (hashes: builds that sum alike
    must agree), then `alternate` (`before` as there)."""
    for label, swaps in builds:
        if before is not None:
            before(swaps)
        use_build(backend, builds, swaps, here)
        for batch in (1, 32):
            print(f"{label} 4b b{batch}: logits {logits_hashes(backend, batch)[:3]}", flush=True)
    alternate(backend, builds, here, before=before)

def models():
    """The demo model and a 2-layer 4b-like random model (vocab cut): (name, config, tensors())."""
    d = Path("sample_data/demo-model")
    cfg = Gemma3Config.from_dir(d)
    yield "demo", cfg, lambda: Checkpoint.open(d, cfg).tensors()
    c4 = dataclasses.replace(shape_config("4b"), num_layers=2, vocab_size=512)
    yield "4b-2layer", c4, lambda: random_tensors(c4, 0)
