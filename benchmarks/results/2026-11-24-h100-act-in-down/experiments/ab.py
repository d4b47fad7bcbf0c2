"""gate/up's activation made in its own last workgroups and split in down's x stage
(LayerFusions.act_in_down) against the reduce_gated_split route: logits bits of 7 decode steps,
the median decode step (two rounds), and a profile per kernel. usage: ab.py SHAPE BATCHES [GEN]"""
import dataclasses
import sys
import time

sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import logits_hashes, median_step  # noqa: E402
from gemma_batch.backends.vulkan import VulkanBackend, coop_plan  # noqa: E402
from gemma_batch.bench.random_weights import random_tensors  # noqa: E402
from gemma_batch.bench.shapes import shape_config  # noqa: E402

shape, batches = sys.argv[1], [int(b) for b in sys.argv[2].split(",")]
gen = int(sys.argv[3]) if len(sys.argv) > 3 else 64
cfg = shape_config(shape)
t0 = time.time()
backend = VulkanBackend(cfg)
backend.load_weights(random_tensors(cfg, 0))
print(f"loaded {shape} in {time.time() - t0:.0f} s", flush=True)
layer = coop_plan.CoopPlan.layer


def reduce_route(self, i):
    return dataclasses.replace(layer(self, i), act_in_down=False)


def use(fused: bool, profile: bool = False) -> None:
    coop_plan.CoopPlan.layer = layer if fused else reduce_route
    backend.profile = profile
    backend._drop_graph()


ref = {}
for fused in (True, False):
    use(fused)
    for batch in batches:
        h = logits_hashes(backend, batch)
        verdict = "reference" if batch not in ref else ("IDENTICAL" if h == ref[batch] else "DIFFERENT")
        ref.setdefault(batch, h)
        print(f"{shape} b{batch} fused={fused}: logits {verdict} {h[:3]}", flush=True)
for rep in range(3):
    for fused in (True, False):
        use(fused)
        for batch in batches:
            t = time.time()
            while time.time() - t < 1.0:  # the clocks up after the host's recording
                median_step(backend, batch, 12)
            print(f"{shape} b{batch} fused={fused}: {median_step(backend, batch, gen) * 1e3:.3f} ms/step", flush=True)
for fused in (True, False):
    use(fused, profile=True)
    for batch in batches:
        median_step(backend, batch, 8)
        prof = backend.profile_seconds()
        top = sorted(prof.items(), key=lambda kv: -kv[1])
        total = sum(prof.values())
        print(f"{shape} b{batch} fused={fused} profile: total {total * 1e6:.0f} us; "
              + ", ".join(f"{k} {v * 1e6:.0f}" for k, v in top[:9]), flush=True)
