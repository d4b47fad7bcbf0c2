"""Median 4b decode step (64 new tokens after 128-token prompts, 1 s of warm-up before each) at
batch 1, 8 and 32 with attention chunks of 64 (shipped), 128 and 256 keys, two rounds, and the
profiled attention time per step.

    python3 chunks.py"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-attention/experiments"))
from common import backend_4b, median_step  # noqa: E402

backend = backend_4b()
for _ in range(2):
    for chunk in (64, 128, 256):
        backend.attention_chunk = chunk
        backend._drop_graph()
        for batch in (1, 8, 32):
            start = time.time()
            while time.time() - start < 1.0:
                median_step(backend, batch, 12)
            print(f"chunk {chunk} b{batch}: {median_step(backend, batch, 64) * 1e3:.3f} ms/step", flush=True)
