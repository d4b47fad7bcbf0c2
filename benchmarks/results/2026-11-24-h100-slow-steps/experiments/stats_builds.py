"""Registers and shared memory of the decode matmul as shipped and with x in two buffers
(twobuf_*.spv from build.sh, xbuffers.diff), 4b constants (benchmarks/kernel_stats.py's figures);
`print_stats` also serves ks2.py.

    python3 stats_builds.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-attention/experiments"))
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from common import file_variant  # noqa: E402
from gemma_batch.backends.vulkan import kernels as Kmod  # noqa: E402
from gemma_batch.backends.vulkan import pipeline_stats  # noqa: E402
from gemma_batch.backends.vulkan.device import Device  # noqa: E402
from gemma_batch.bench.shapes import shape_config  # noqa: E402
from benchmarks.kernel_stats import hopper_resident  # noqa: E402

HERE = Path(__file__).resolve().parent
NAMES = ("coop_t16", "coop_gated_t16", "coop_rows_t16")


def print_stats(builds: list[tuple[str, str | None]]) -> None:
    """Per (label, SPIR-V file prefix in this folder, None: the shipped build), each decode-matmul
    variant's registers, shared memory and workgroups a Hopper SM holds; the variants as shipped after."""
    dev = Device(capture_statistics=True)
    shipped = {n: Kmod.VARIANTS[n] for n in NAMES}
    for label, prefix in builds:
        kernels = Kmod.Kernels.for_model(dev, shape_config("4b"))
        for name in NAMES:
            if prefix:
                Kmod.VARIANTS[name] = file_variant(name, Kmod.VARIANTS[name].source, HERE / f"{prefix}{name}.spv")
            stats = pipeline_stats.statistics(kernels, name)
            regs, shared = int(stats["Register Count"]), int(stats["Shared Memory Size"])
            print(f"{label} {name}: {regs} registers, {shared} B shared, {hopper_resident(regs, shared, 128)} a Hopper SM",
                  flush=True)
        Kmod.VARIANTS.update(shipped)
        kernels.close()
    dev.close()


if __name__ == "__main__":
    print_stats([("shipped", None), ("two x buffers", "twobuf_")])
