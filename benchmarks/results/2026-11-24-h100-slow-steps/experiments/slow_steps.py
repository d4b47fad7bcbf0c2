"""Every decode step of the bench's 4b cases (128-token prompts, 128 new tokens, batch 1 and 32):
wall and GPU ms, the median and mean, and the slowest steps, twice as the bench runs them and
once with Python's garbage collector off during the timed run.

    python3 slow_steps.py"""
import gc
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-attention/experiments"))
from common import backend_4b  # noqa: E402
from gemma_batch.bench.runner import run_case  # noqa: E402


def report(label, run):
    decode = [(i, s) for i, s in enumerate(run.steps) if not s.prefill_tokens]
    wall = [1e3 * s.wall_s for _, s in decode]
    dev = [1e3 * (s.device_s or 0) for _, s in decode]
    med, mean = statistics.median(wall), statistics.fmean(wall)
    print(f"{label}: {len(decode)} decode steps, wall median {med:.3f} mean {mean:.3f} ms; "
          f"GPU median {statistics.median(dev):.3f} mean {statistics.fmean(dev):.3f} ms; "
          f"tokens/s {sum(s.sampled_tokens for _, s in decode) / sum(s.wall_s for _, s in decode):.1f}", flush=True)
    excess = sorted(((w - med, i, w, d) for (i, _), w, d in zip(decode, wall, dev)), reverse=True)
    print(f"  excess over the median, summed: {sum(max(0, e) for e, *_ in excess):.2f} ms; slowest 8 (step: wall / GPU ms): "
          + ", ".join(f"{i}: {w:.2f} / {d:.2f}" for _, i, w, d in excess[:8]), flush=True)
    print("  wall by step: " + " ".join(f"{w:.2f}" for w in wall), flush=True)
    print("  GPU by step:  " + " ".join(f"{d:.2f}" for d in dev), flush=True)


backend = backend_4b()
for batch in (1, 32):
    for rep in range(2):
        report(f"b{batch} run {rep}", run_case(backend, batch, 128, 128))
    gc.collect()
    gc.disable()
    report(f"b{batch} gc off", run_case(backend, batch, 128, 128))
    gc.enable()
