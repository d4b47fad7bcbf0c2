"""reduce_gated_split in pieces up to P rows (PIECE_ROWS; shipped 8): logits bits against the
shipped build, and the median decode step, two rounds. usage: ab3.py BATCHES P,P,..."""
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import logits_hashes, median_step, swap
from gemma_batch.backends.vulkan import VulkanBackend, grids
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.shapes import shape_config

HERE = Path(__file__).resolve().parent
batches = [int(b) for b in sys.argv[1].split(",")]
pieces = [int(p) for p in sys.argv[2].split(",")]
cfg = shape_config("4b")
backend = VulkanBackend(cfg)
backend.load_weights(random_tensors(cfg, 0))
ref = {}

def use(p):
    grids.GATED_PIECE_ROWS = p
    swap(backend, "reduce_gated_split", HERE / f"gated_p{p}.spv")

for rep in range(2):
    for p in pieces:
        use(p)
        for batch in batches:
            if rep == 0:
                hashes = logits_hashes(backend, batch)
                verdict = "reference" if batch not in ref else ("IDENTICAL" if hashes == ref[batch] else "DIFFERENT")
                ref.setdefault(batch, hashes)
                print(f"4b b{batch} pieces<={p}: logits {verdict}", flush=True)
            print(f"4b b{batch} pieces<={p}: {median_step(backend, batch, 64)*1e3:.3f} ms/step", flush=True)
