"""What feeding a prompt costs beside a full batch, by the size of its chunks: 31 sequences decode
while a 32nd prompt is fed c tokens a step (the step budget set to 31 + c), random 4b weights,
one step at a time; the median device time of those steps against the median decode step of
32 sequences. The engine runs steps of up to 64 rows on the decode tiles, larger ones on the
prefill tile.

    python3 chunk_cost.py [c,c,...] [--profile]   # --profile: every dispatch timed, each fed step by kernel"""
import statistics
import time
import sys
from pathlib import Path

import numpy as np

EARLY = Path(__file__).resolve().parents[2] / "2026-11-24-h100-early-stops/experiments"
sys.path.insert(0, str(EARLY))
import stops_ab  # noqa: E402
from gemma_batch.bench.runner import bench_kv_plan  # noqa: E402
from gemma_batch.engine.engine import Engine, Request  # noqa: E402
from gemma_batch.engine.sampling_params import SamplingParams  # noqa: E402

BATCH, BUDGET = 32, 512
PROFILE = "--profile" in sys.argv


def measure(backend, c: int, rng) -> tuple[float, float, int]:
    cfg = backend.cfg

    def prompt(n):
        return [cfg.bos_token_id, *rng.integers(3, cfg.vocab_size, n - 1).tolist()]

    engine = Engine(backend, bench_kv_plan(backend, BATCH, 1024, BUDGET), None, BATCH, BUDGET, schedule_ahead=0)
    for i in range(BATCH - 1):
        engine.add(Request(i, prompt(128), SamplingParams(max_tokens=400)))
    while engine.stats.generated_tokens < BATCH - 1:  # their prompts, then a first token each
        engine.step()
    decode = []
    for _ in range(8):
        engine.step()
        decode.append(backend.last_step_device_seconds())
    engine.scheduler.step_token_budget = BATCH - 1 + c
    n = min(512, max(8 * c, 32))
    engine.add(Request(99, prompt(n), SamplingParams(max_tokens=4)))
    fed = []
    while True:
        p0 = engine.stats.prefill_tokens
        engine.step()
        if engine.stats.prefill_tokens - p0 == 0:
            break
        fed.append(backend.last_step_device_seconds())
        if PROFILE:
            top = sorted(backend.profile_seconds().items(), key=lambda kv: -kv[1])[:6]
            print(f"    {time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} chunk {c} step {len(fed)} ({engine.stats.prefill_tokens - p0} prompt tokens): {fed[-1] * 1e3:.2f} ms; "
                  + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in top), flush=True)
    return statistics.median(decode), statistics.median(fed[:-1] or fed), len(fed)


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--profile"]
    chunks = [int(c) for c in args[0].split(",")] if args else \
        [1, 8, 16, 24, 32, 33, 48, 64, 97, 128, 160, 224, 288, 352, 481]
    if PROFILE:
        from gemma_batch.backends.vulkan import VulkanBackend
        from gemma_batch.bench.random_weights import random_tensors
        backend = VulkanBackend(stops_ab.backend_4b.__globals__["shape_config"]("4b"), profile=True)
        backend.load_weights(random_tensors(backend.cfg, 0))
    else:
        backend = stops_ab.backend_4b()
    rng = np.random.default_rng(5)
    measure(backend, 481, rng)  # warm-up: every recording, the largest buffers
    for rnd in range(2):
        for c in chunks:
            dec, fed, steps = measure(backend, c, rng)
            extra = fed - dec
            print(f"round {rnd} chunk {c:3d} ({31 + c} rows): step {fed * 1e3:6.2f} ms against decode {dec * 1e3:.2f}; "
                  f"extra {extra * 1e3:6.2f} ms = {extra / c * 1e3:6.3f} ms a prompt token ({steps} steps)", flush=True)
        if PROFILE:
            break


if __name__ == "__main__":
    main()
