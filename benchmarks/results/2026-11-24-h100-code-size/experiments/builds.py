"""What this folder's scripts share: the driver's statistics of a kernel as each build makes it,
and builds that differ in the host's settings rather than in SPIR-V, measured alternately."""
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "2026-11-24-h100-attention/experiments"))
sys.path.insert(0, str(HERE.parents[3]))
from common import backend_4b, file_variant, logits_hashes, median_step  # noqa: E402
from gemma_batch.backends.vulkan import kernels as Kmod  # noqa: E402
from gemma_batch.backends.vulkan import pipeline_stats  # noqa: E402
from gemma_batch.backends.vulkan.device import Device  # noqa: E402
from gemma_batch.bench.shapes import shape_config  # noqa: E402


SHIPPED = dict(Kmod.VARIANTS)  # the kernels as shipped, before any build swaps one


def from_files(files: dict) -> object:
    """A setup(backend) for `alternate_settings`: each kernel named in `files` (name -> SPIR-V
    path) built from its file, every other one as shipped; pipelines built again on next use (a
    specialised pipeline's key is not the kernel's name)."""
    def setup(backend) -> None:
        Kmod.VARIANTS.update(SHIPPED)
        for name, spv in files.items():
            Kmod.VARIANTS[name] = file_variant(name, SHIPPED[name].source, spv)
        backend.kernels.pipelines.clear()
    return setup


def print_stats(rows) -> None:
    """rows: (label, kernel name, SPIR-V path or None for the shipped one, specialization values or ()):
    each one's registers and binary size as the driver builds it with the 4b constants."""
    dev = Device(capture_statistics=True)
    kernels = Kmod.Kernels.for_model(dev, shape_config("4b"))
    build = kernels.pipeline
    for label, name, spv, special in rows:
        Kmod.VARIANTS[name] = file_variant(name, SHIPPED[name].source, spv) if spv else SHIPPED[name]
        kernels.pipelines.clear()
        kernels.pipeline = lambda n, _s=(), v=special: build(n, v)
        s = pipeline_stats.statistics(kernels, name)
        print(f"{label:26s} {name}: {s.get('Register Count')} registers, binary {s.get('Binary Size')} B", flush=True)
    Kmod.VARIANTS.update(SHIPPED)
    kernels.close()
    dev.close()


def alternate_settings(builds, batches=(1, 32), rounds: int = 3) -> None:
    """builds: (label, setup(backend)) pairs, setup putting the build's host setting in place. Each
    build's logits hashes at each batch (builds that sum alike must agree), then its median 4b
    decode step, the builds alternating, `rounds` times, 1 s of warm-up before each measurement."""
    backend = backend_4b()
    for label, setup in builds:
        setup(backend)
        backend._drop_graph()
        for batch in batches:
            print(f"{label} 4b b{batch}: logits {logits_hashes(backend, batch)[:3]}", flush=True)
    for _ in range(rounds):
        for label, setup in builds:
            setup(backend)
            backend._drop_graph()
            for batch in batches:
                start = time.time()
                while time.time() - start < 1.0:
                    median_step(backend, batch, 12)
                print(f"{label} 4b b{batch}: {median_step(backend, batch, 64) * 1e3:.3f} ms/step", flush=True)
