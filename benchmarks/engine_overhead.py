"""The engine's own host time per decode step (scheduler, KV bookkeeping, step building), no device.

    python benchmarks/engine_overhead.py [--batch 32] [--prompt-len 128] [--gen-len 200] [--shape tiny]

The CPU backend is loaded with random weights of `--shape` and its `step` replaced by one that
returns a fixed token for every sequence, so a step's time is the engine's Python alone. Prints
the median and 10th percentile over the decode steps. Compare commits by running them
interleaved: the figures move with the machine's load.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gemma_batch.backends.base import StepResult  # noqa: E402
from gemma_batch.backends.cpu import CpuBackend  # noqa: E402
from gemma_batch.bench.random_weights import random_tensors  # noqa: E402
from gemma_batch.bench.runner import prefilled_engine  # noqa: E402
from gemma_batch.bench.shapes import shape_config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--gen-len", type=int, default=200)
    parser.add_argument("--shape", default="tiny")
    args = parser.parse_args()
    cfg = shape_config(args.shape)
    backend = CpuBackend(cfg)
    backend.load_weights(random_tensors(cfg, 0))
    backend.step = lambda batch: StepResult(np.full(batch.num_seqs, 5, np.int32))  # no model: the engine alone
    engine = prefilled_engine(backend, args.batch, args.prompt_len, args.gen_len)
    times = []
    while engine.num_unfinished:
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    ms = 1e3 * np.array(times)
    print(f"batch {args.batch}, prompts of {args.prompt_len}: engine-only decode step {np.median(ms):.3f} ms median, "
          f"{np.percentile(ms, 10):.3f} ms 10th percentile ({len(ms)} steps)")


if __name__ == "__main__":
    main()
