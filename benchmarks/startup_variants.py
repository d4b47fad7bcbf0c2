"""Experiment (issue 67): `gemma-batch run` with parts of the start-up switched back, no product code: `noarrow` (no pyarrow set-up thread), `eager` (every recording made at `reserve`). Usage: python benchmarks/startup_variants.py none|noarrow|eager|noarrow,eager RUN-ARGS..."""
import sys, time
modes = sys.argv.pop(1).split(",")
sys.argv = ["gemma-batch", "run", *sys.argv[1:]]
from gemma_batch.job import runner
from gemma_batch.backends.vulkan.backend import VulkanBackend
from gemma_batch.backends.vulkan.recordings import FLASH
if "noarrow" in modes:
    runner.set_up_arrow_meanwhile = lambda: None
if "eager" in modes:
    reserve = VulkanBackend.reserve
    def eager(self, *a, **k):
        reserve(self, *a, **k)
        t = time.perf_counter()
        for g in self.graphs:
            for mode in g.modes:
                if mode not in g._recorded:
                    g.mode, g.flash = mode.removesuffix(FLASH), mode.endswith(FLASH)
                    g.cb, g.stamped = self.device.command_buffer(), []
                    g._record()
                    g._recorded[mode] = (g.cb, g.stamped)
        print(f"HARNESS eager recording {time.perf_counter() - t:.3f} s", file=sys.stderr)
    VulkanBackend.reserve = eager
from gemma_batch.cli import app
app()
