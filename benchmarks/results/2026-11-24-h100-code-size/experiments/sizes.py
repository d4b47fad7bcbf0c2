"""The driver's binary size and registers of each spv/sz_<KNOBS>_<variant>.spv (build_variants.py
with sizes.diff: attention.comp with parts compiled out, results wrong on purpose), 4b constants:
where attention's binary goes.

    python3 sizes.py"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "2026-11-24-h100-attention/experiments"))
sys.path.insert(0, str(HERE.parents[3]))
from common import file_variant  # noqa: E402
from gemma_batch.backends.vulkan import kernels as Kmod  # noqa: E402
from gemma_batch.backends.vulkan import pipeline_stats  # noqa: E402
from gemma_batch.backends.vulkan.device import Device  # noqa: E402
from gemma_batch.bench.shapes import shape_config  # noqa: E402

if __name__ == "__main__":
    dev = Device(capture_statistics=True)
    kernels = Kmod.Kernels.for_model(dev, shape_config("4b"))
    for path in sorted((HERE / "spv").glob("sz_*.spv")):
        variant = next(n for n in sorted(Kmod.VARIANTS, key=len, reverse=True) if path.stem.endswith("_" + n))
        label = path.stem[len("sz_"):-len(variant) - 1]
        name = f"exp_{path.stem}"
        Kmod.VARIANTS[name] = file_variant(name, Kmod.VARIANTS[variant].source, path)
        s = pipeline_stats.statistics(kernels, name)
        print(f"{variant:30s} {label:10s} {s.get('Register Count')!s:>4s} registers, binary {s.get('Binary Size')} B", flush=True)
    kernels.close()
    dev.close()
