"""GPU time by kernel of the steps a job runs once its batch is full: a decode step of 32 sequences,
and mixed steps of 31 decoding sequences plus a new prompt of P tokens (P = 128: a 159-row step;
P = 481: the step budget of 512), 4b random weights, every dispatch timed (profile=True).

    python3 profile_mixed.py"""
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stops_ab import BATCH, BUDGET  # noqa: E402
from gemma_batch.backends.vulkan import VulkanBackend  # noqa: E402
from gemma_batch.bench.random_weights import random_tensors  # noqa: E402
from gemma_batch.bench.runner import bench_kv_plan  # noqa: E402
from gemma_batch.bench.shapes import shape_config  # noqa: E402
from gemma_batch.engine.engine import Engine, Request  # noqa: E402
from gemma_batch.engine.sampling_params import SamplingParams  # noqa: E402


def main() -> None:
    cfg = shape_config("4b")
    backend = VulkanBackend(cfg, profile=True)
    backend.load_weights(random_tensors(cfg, 0))
    rng = np.random.default_rng(3)

    def prompt(n):
        return [cfg.bos_token_id, *rng.integers(3, cfg.vocab_size, n - 1).tolist()]

    for rnd in range(2):  # the first round warms up
        for p in (128, 481):
            engine = Engine(backend, bench_kv_plan(backend, BATCH, 640, BUDGET), None, BATCH, BUDGET, schedule_ahead=0)
            for i in range(BATCH - 1):
                engine.add(Request(i, prompt(128), SamplingParams(max_tokens=64)))
            for _ in range(12):  # 31 x 128 prompt tokens in steps of 512, then decode
                engine.step()
            engine.add(Request(99, prompt(p), SamplingParams(max_tokens=8)))
            for label in (f"31 decoding + a {p}-token prompt ({31 + p} rows)", "32 decoding"):
                start = time.perf_counter()
                engine.step()
                wall = time.perf_counter() - start
                prof = backend.profile_seconds()
                if rnd:
                    kernels = ", ".join(f"{k} {v * 1e3:.3f}" for k, v in prof.items())
                    print(f"{label}: wall {wall * 1e3:.2f} ms, GPU {sum(prof.values()) * 1e3:.2f} ms; {kernels}", flush=True)
                for _ in range(3 if label.startswith("31") else 0):
                    engine.step()  # the new prompt's step is done; a few decode steps before the next profile


if __name__ == "__main__":
    main()
