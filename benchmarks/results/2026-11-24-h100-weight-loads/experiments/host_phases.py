"""Where the wall time of the slow batch-32 decode steps goes: the bench's run_case at 4b (128 + 128
tokens) three times, with the backend's submit and wait timed. Per step: the engine's step, the
backend's submit of the step ahead, its wait, and the rest (the host's own work); the 8 slowest.

    python3 host_phases.py"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-attention/experiments"))
from common import backend_4b  # noqa: E402
from gemma_batch.bench.runner import run_case  # noqa: E402

backend = backend_4b()
log = []
submit, wait = backend.submit, backend.wait


def timed(fn, kind):
    def call(*args, **kwargs):
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        log.append((kind, t, time.perf_counter()))
        return out
    return call


backend.submit, backend.wait = timed(submit, "submit"), timed(wait, "wait")
for rep in range(3):
    log.clear()
    run = run_case(backend, 32, 128, 128)
    waits = [e for e in log if e[0] == "wait"][-len(run.steps):]
    subs = [e for e in log if e[0] == "submit"]
    rows = []
    for i, s in enumerate(run.steps):
        if s.prefill_tokens:
            continue
        w = waits[i]
        sub = sum(b - a for _, a, b in subs if w[1] >= a >= w[1] - s.wall_s)  # the step's submits, before its wait
        rows.append((1e3 * s.wall_s, i, 1e3 * (w[2] - w[1]), 1e3 * sub, 1e3 * (s.device_s or 0)))
    wall = [r[0] for r in rows]
    print(f"run {rep}: wall median {statistics.median(wall):.3f} mean {statistics.fmean(wall):.3f} ms", flush=True)
    for r in sorted(rows, reverse=True)[:8]:
        print(f"  step {r[1]}: wall {r[0]:.2f} = wait {r[2]:.2f} + submit {r[3]:.2f} + rest {r[0] - r[2] - r[3]:.2f}; GPU {r[4]:.2f}",
              flush=True)
