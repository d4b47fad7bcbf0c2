"""Experiment: why benchmarks/decode_profile.py reports a 15.5 ms wall step at 4b batch 1, where
its kernels sum to 5.16 ms and the bench's median step is 4.76 ms.

For a backend built with and without `profile` (a timestamp after every dispatch, or one per
step), after the same warm-up as decode_profile.py: every decode step's wall time
(`engine.step()`) and the GPU time its timestamps give, at batch 1 and 32, 128-token prompts,
`gen` new tokens (16, as in the call that showed 15.5 ms, and 64).
usage: profile_walls.py [warm-up seconds: the bench's WARMUP_SECONDS unless given]"""
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks/results/2026-11-24-h100-attention/experiments"))
from common import backend_4b  # noqa: E402
from gemma_batch.bench import runner  # noqa: E402
from gemma_batch.bench.runner import prefilled_engine, warm_up  # noqa: E402


def walls(backend, batch: int, gen: int) -> None:
    def one_round() -> None:
        warm = prefilled_engine(backend, batch, 128, gen)
        while warm.num_unfinished:
            warm.step()

    print(f"{time.time():.2f} start: profile={backend.profile} b{batch} gen {gen}", flush=True)
    warm_up(one_round)
    print(f"{time.time():.2f} warm-up done", flush=True)
    engine, wall, gpu = prefilled_engine(backend, batch, 128, gen), [], []
    while engine.num_unfinished:
        start = time.perf_counter()
        engine.step()
        wall.append(time.perf_counter() - start)
        gpu.append(sum(backend.profile_seconds().values()))
    ms = lambda xs: " ".join(f"{x * 1e3:.2f}" for x in xs)  # noqa: E731
    print(f"{time.time():.2f} profile={backend.profile} b{batch} gen {gen}: median wall {np.median(wall[2:]) * 1e3:.2f} ms, "
          f"median GPU {np.median(gpu[2:]) * 1e3:.2f} ms\n  wall: {ms(wall)}\n  GPU:  {ms(gpu)}", flush=True)


def main() -> None:
    if len(sys.argv) > 1:
        runner.WARMUP_SECONDS = float(sys.argv[1])  # read by warm_up at each call
    print(f"warm-up: at least {runner.WARMUP_SECONDS} s after the first round", flush=True)
    backend = backend_4b(profile=True)
    for profile in (True, False, True):
        backend.profile = profile
        backend._drop_graph()
        for batch, gen in ((1, 16), (1, 64), (32, 16)):
            walls(backend, batch, gen)


if __name__ == "__main__":
    main()
