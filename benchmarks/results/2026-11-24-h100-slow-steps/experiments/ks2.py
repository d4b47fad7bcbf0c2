"""The decode matmul with 2 k blocks a stage instead of 4 (ks2.diff, ks2_*.spv; fewer weight tiles
held, so fewer registers; the same sums in the same order): its registers and workgroups an SM,
then logits hashes (must agree) and the median 4b decode step at batch 1 and 32 against the
shipped build, alternating (common.compare_builds).

    python3 ks2.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-attention/experiments"))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from common import backend_4b, compare_builds, file_variant  # noqa: E402
from gemma_batch.backends.vulkan import kernels as Kmod  # noqa: E402
from gemma_batch.backends.vulkan import pipeline_stats  # noqa: E402
from gemma_batch.backends.vulkan.device import Device  # noqa: E402
from gemma_batch.bench.shapes import shape_config  # noqa: E402
from benchmarks.kernel_stats import hopper_resident  # noqa: E402

HERE = Path(__file__).resolve().parent
NAMES = ("coop_t16", "coop_gated_t16", "coop_rows_t16")
dev = Device(capture_statistics=True)
kernels = Kmod.Kernels.for_model(dev, shape_config("4b"))
shipped = {n: Kmod.VARIANTS[n] for n in NAMES}
for name in NAMES:
    Kmod.VARIANTS[name] = file_variant(name, Kmod.VARIANTS[name].source, HERE / f"ks2_{name}.spv")
    stats = pipeline_stats.statistics(kernels, name)
    regs, shared = int(stats["Register Count"]), int(stats["Shared Memory Size"])
    print(f"2 k blocks a stage, {name}: {regs} registers, {shared} B shared, {hopper_resident(regs, shared, 128)} a Hopper SM",
          flush=True)
Kmod.VARIANTS.update(shipped)
kernels.close()
dev.close()
compare_builds(backend_4b(), [("4 k blocks a stage", []), ("2 k blocks a stage", [[n, f"ks2_{n}.spv"] for n in NAMES])], HERE)
