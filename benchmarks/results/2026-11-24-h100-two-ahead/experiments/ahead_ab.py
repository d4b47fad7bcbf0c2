"""The bench's 4b decode cases (128-token prompts, 128 new tokens) with one step and with two
steps submitted ahead (GEMMA_BATCH_SCHEDULE_AHEAD=1 / 2), alternating, three rounds: decode
tokens/s, the wall step's median and mean, the GPU step's mean, and the steps whose wall time
exceeds the GPU mean by over 1 ms.

    python3 ahead_ab.py [batch,...]"""
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-attention/experiments"))
from common import backend_4b  # noqa: E402
from gemma_batch.bench.runner import run_case  # noqa: E402


def report(label: str, run) -> None:
    decode = [s for s in run.steps if not s.prefill_tokens]
    wall = [1e3 * s.wall_s for s in decode]
    dev = [1e3 * (s.device_s or 0) for s in decode]
    gpu = statistics.fmean(dev)
    slow = [f"{w:.1f}" for w in wall if w > gpu + 1]
    print(f"{label}: {sum(s.sampled_tokens for s in decode) / sum(s.wall_s for s in decode):8.1f} tok/s; wall median "
          f"{statistics.median(wall):.3f} mean {statistics.fmean(wall):.3f} ms; GPU mean {gpu:.3f} ms; "
          f"{len(slow)} steps over GPU mean + 1 ms: {' '.join(slow)}", flush=True)


backend = backend_4b()
batches = [int(b) for b in (sys.argv[1] if len(sys.argv) > 1 else "32,1").split(",")]
for batch in batches:
    for rnd in range(3):
        for ahead in ("2", "1"):
            os.environ["GEMMA_BATCH_SCHEDULE_AHEAD"] = ahead
            report(f"b{batch} round {rnd} ahead {ahead}", run_case(backend, batch, 128, 128))
