"""Decode step time with attention_float16_split swapped for experimental builds."""
import sys, time
from pathlib import Path
import numpy as np
from gemma_batch.backends.vulkan import kernels as Kmod
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.runner import prefilled_engine
from gemma_batch.bench.shapes import shape_config

HERE = Path(__file__).resolve().parent
class ExpVariant(Kmod.Variant):
    @property
    def spv(self):
        return HERE / f"attn_{self.name.split(':')[1]}.spv"

shape = sys.argv[1]
batches = [int(b) for b in sys.argv[2].split(",")]
names = sys.argv[3].split(",")
gen = int(sys.argv[4]) if len(sys.argv) > 4 else 48
cfg = shape_config(shape)
backend = VulkanBackend(cfg)
backend.load_weights(random_tensors(cfg, 0))
for rep in range(2):
    for name in names:
        Kmod.VARIANTS["attention_float16_split"] = ExpVariant(f"x:{name}", "attention")
        backend.kernels.pipelines.pop("attention_float16_split", None)
        for batch in batches:
            backend._drop_graph()
            engine = prefilled_engine(backend, batch, 128, gen)
            times = []
            while engine.num_unfinished:
                s = time.perf_counter(); engine.step(); times.append(time.perf_counter() - s)
            step = float(np.median(times[4:]))
            print(f"{shape} b{batch} gen{gen} attn {name}: {step*1e3:.3f} ms/step", flush=True)
