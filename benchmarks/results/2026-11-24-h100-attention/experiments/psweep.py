"""Per variant: median decode step (wall) and the attention kernel's GPU time per step
(profile timestamps), 4b random weights, 128-token prompts."""
import sys, time
from pathlib import Path
import numpy as np
from gemma_batch.backends.vulkan import kernels as Kmod
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.runner import prefilled_engine
from gemma_batch.bench.shapes import shape_config

HERE = Path(__file__).resolve().parent
NAME = "attention_float16_split"
class ExpVariant(Kmod.Variant):
    @property
    def spv(self):
        return HERE / f"attn_{self.name.split(':')[1]}.spv"

shape, batches, names = sys.argv[1], [int(b) for b in sys.argv[2].split(",")], sys.argv[3].split(",")
cfg = shape_config(shape)
chunk = int(sys.argv[4]) if len(sys.argv) > 4 else 64
backend = VulkanBackend(cfg, profile=True, attention_chunk=chunk)
backend.load_weights(random_tensors(cfg, 0))
for name in names:
    Kmod.VARIANTS[NAME] = ExpVariant(f"x:{name}", "attention")
    backend.kernels.pipelines.pop(NAME, None)
    for batch in batches:
        backend._drop_graph()
        engine = prefilled_engine(backend, batch, 128, 40)
        times, attn, other = [], [], {}
        while engine.num_unfinished:
            s = time.perf_counter(); engine.step(); times.append(time.perf_counter() - s)
            prof = backend.profile_seconds()
            attn.append(prof.get(NAME, 0.0))
            for k, v in prof.items():
                other.setdefault(k, []).append(v)
        top = sorted(((float(np.median(v[4:])), k) for k, v in other.items()), reverse=True)[:6]
        print(f"{shape} b{batch} chunk{chunk} {name}: step {np.median(times[4:])*1e3:.3f} ms, attention GPU {np.median(attn[4:])*1e3:.3f} ms/step"
              f" ({np.median(attn[4:])*1e6/cfg.num_layers:.1f} us/layer); " + ", ".join(f"{k} {v*1e3:.3f}" for v, k in top), flush=True)
