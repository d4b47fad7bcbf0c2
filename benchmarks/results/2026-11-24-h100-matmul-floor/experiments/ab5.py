"""In one process: 'old' (the LM head's reduce, coop_t16 as before, gate/up pieces up to 8 rows)
against 'new' (the tree of the LM-head experiment, reverted since: graph.py's scaled decode tile,
switched off through graph.COOP_DIRECT_DTYPES) and 'oldcoop' (new with coop_t16 as before):
logits bits of 7 steps, median decode step, two rounds; then GPU us per kernel (profile)."""
import os, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import SHIPPED, logits_hashes, median_step, swap
from gemma_batch.backends.vulkan import VulkanBackend, grids, graph
from gemma_batch.backends.vulkan import kernels as Kmod
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.shapes import shape_config

HERE = Path(__file__).resolve().parent
batches = [int(b) for b in sys.argv[1].split(",")]
cfg = shape_config("4b")

def use(backend, label):
    for name in ("coop_t16", "reduce_gated_split"):
        Kmod.VARIANTS[name] = SHIPPED[name]
        backend.kernels.pipelines.pop(name, None)
    graph.COOP_DIRECT_DTYPES = ("T16",) if label != "old" else ()
    grids.GATED_PIECE_ROWS = 16 if label != "old" else 8
    if label == "old":
        swap(backend, "reduce_gated_split", HERE / "gated_p8.spv")
    if label in ("old", "oldcoop"):
        swap(backend, "coop_t16", HERE / "coop_t16_old.spv")
    backend._drop_graph()

labels = ["old", "new", "oldcoop"] if not os.environ.get("ONLYPROFILE") else ["old", "new"]
ref = {}
def timing():
    backend = VulkanBackend(cfg)
    backend.load_weights(random_tensors(cfg, 0))
    for rep in range(2):
        for label in labels:
            use(backend, label)
            for batch in batches:
                if rep == 0 and batch in (1, 32):
                    hashes = ','.join(logits_hashes(backend, batch))
                    print(f"{label} b{batch} logits {'IDENTICAL' if ref.setdefault(batch, hashes) == hashes else 'DIFFERENT'}", flush=True)
                print(f"{label} b{batch}: {median_step(backend, batch, 64)*1e3:.3f} ms/step", flush=True)
    backend.close()
if not os.environ.get("ONLYPROFILE"):
    timing()
if os.environ.get("NOPROFILE"):
    sys.exit()
backend = VulkanBackend(cfg, profile=True)
backend.load_weights(random_tensors(cfg, 0))
for label in labels[:2] * 2:
    use(backend, label)
    for batch in (1, 32):
        per = {}
        def grab():
            for k, v in backend.profile_seconds().items():
                per.setdefault(k, []).append(v)
        median_step(backend, batch, 24, grab)
        show = {k: float(np.median(v[4:])) * 1e6 for k, v in per.items()}
        print(f"PROFILE {label} b{batch}: total {sum(show.values()):.0f}: " + ", ".join(f"{k} {v:.1f}" for k, v in show.items()), flush=True)
