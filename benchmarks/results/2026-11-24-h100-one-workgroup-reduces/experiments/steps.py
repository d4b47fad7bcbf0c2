"""Median 4b decode step at batch 1, 2, 4, 8, 12, 16 and 32 (64 new tokens after 128-token
prompts, 1 s of warm-up before each), and the logits hashes of 7 decode steps at batch 1 and 32,
for the tree this runs in: the committed one, or the build before it (run from .exp/old). In a
tree with graph.GATED_PIECES_MODES, also with gate/up's reduce a workgroup per row in every
recording (the two must give the same logits).

    python3 steps.py LABEL"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-attention/experiments"))
from common import backend_4b, logits_hashes, median_step  # noqa: E402
from gemma_batch.backends.vulkan import graph  # noqa: E402

label = sys.argv[1]
backend = backend_4b()
configs = [(label, None)]
if hasattr(graph, "GATED_PIECES_MODES"):
    configs.append((f"{label}, gated rows everywhere", ()))
shipped = getattr(graph, "GATED_PIECES_MODES", None)
for name, modes in configs:
    graph.GATED_PIECES_MODES = shipped if modes is None else modes
    backend._drop_graph()
    for batch in (1, 32):
        print(f"{name} b{batch}: logits {logits_hashes(backend, batch)[:3]}", flush=True)
for _ in range(2):
    for name, modes in configs:
        graph.GATED_PIECES_MODES = shipped if modes is None else modes
        backend._drop_graph()
        for batch in (1, 2, 4, 8, 12, 16, 32):
            start = time.time()
            while time.time() - start < 1.0:
                median_step(backend, batch, 12)
            print(f"{name} b{batch}: {median_step(backend, batch, 64) * 1e3:.3f} ms/step", flush=True)
