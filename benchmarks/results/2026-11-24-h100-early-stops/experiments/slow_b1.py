"""Where the batch-1 decode steps that are slow on the device fall: the bench's 4b batch-1 case
(128 + 128 tokens) five times in one process; per run, each slow step's index, wall and device
time (bench.metrics.SLOW_STEP), and the run's start on the wall clock, to set beside
`nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu -lms 50`.

    python3 slow_b1.py"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-attention/experiments"))
from common import backend_4b  # noqa: E402
from gemma_batch.bench.metrics import SLOW_STEP  # noqa: E402
from gemma_batch.bench.runner import run_case  # noqa: E402

backend = backend_4b()
for rnd in range(5):
    started = time.time()
    run = run_case(backend, 1, 128, 128)
    decode = [s for s in run.steps if not s.prefill_tokens]
    wall = statistics.median(s.wall_s for s in decode)
    dev = statistics.median(s.device_s for s in decode)
    slow = [(i, round(1e3 * s.wall_s, 2), round(1e3 * s.device_s, 2), round(s.end_s, 3))
            for i, s in enumerate(decode) if s.wall_s > SLOW_STEP * wall]
    print(f"run {rnd} (timed part from {time.strftime('%H:%M:%S', time.gmtime(started))}.{int(started % 1 * 1000):03d} UTC "
          f"+ warm-up): median wall {1e3 * wall:.3f} device {1e3 * dev:.3f} ms, mean device "
          f"{1e3 * statistics.fmean(s.device_s for s in decode):.3f}; slow (index, wall, device, end s): {slow}", flush=True)
