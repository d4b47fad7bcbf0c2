"""Where a job's time goes, step by step: stops_ab.py's job (256 random 128-token prompts on random
4b weights, at most 32 at once, steps of up to 512 tokens, two steps ahead) with and without
early stops, and the same with prompt lengths drawn from 16-512. Every `Engine.step` call is
logged: its wall time, the device time of the step it waited for, and the prompt tokens and rows
that step ran (from the engine's counters); the backend's step-buffer growths (new recordings)
are counted and timed.

    python3 job_steps.py [requests]"""
import statistics
import sys
import time
from pathlib import Path

import numpy as np

EARLY = Path(__file__).resolve().parents[2] / "2026-11-24-h100-early-stops/experiments"
sys.path.insert(0, str(EARLY))
import stops_ab  # noqa: E402
from stops_ab import BATCH, BUDGET, GEN  # noqa: E402
from gemma_batch.bench.runner import bench_kv_plan  # noqa: E402
from gemma_batch.engine.engine import Engine, Request  # noqa: E402
from gemma_batch.engine.sampling_params import SamplingParams  # noqa: E402


def logged_run(backend, prompts, stops, label, small=True):
    growths = []
    ensure = backend._ensure

    def timed_ensure(need):
        t = time.perf_counter()
        ensure(need)
        growths.append((time.perf_counter() - t, need))

    backend._ensure = timed_ensure
    longest = max(len(p) for p in prompts)
    engine = Engine(backend, bench_kv_plan(backend, BATCH, longest + GEN, BUDGET), None, BATCH, BUDGET, schedule_ahead=2)
    if not small:  # (GEMMA_BATCH_SMALL_STEPS=0)
        engine.scheduler.small_step = None
    done = {}
    for i, ids in enumerate(prompts):
        engine.add(Request(i, ids, SamplingParams(max_tokens=GEN, temperature=1.0),
                           frozenset(stops[i:i + 1] if stops else ()), rng_key=(i, 7)))
    st, rows = engine.stats, []
    started = time.perf_counter()
    while engine.num_unfinished:
        p0, b0, s0, t0 = st.prefill_tokens, st.batch_size_sum, st.steps, time.perf_counter()
        done.update((c.request_id, c.token_ids) for c in engine.step())
        wall = time.perf_counter() - t0
        rows.append((wall, backend.last_step_device_seconds() or 0.0, st.prefill_tokens - p0, st.batch_size_sum - b0))
    total = time.perf_counter() - started
    backend._ensure = ensure
    dev = sum(r[1] for r in rows)
    print(f"{label}: {st.generated_tokens} tokens in {total:.3f} s = {st.generated_tokens / total:,.1f} tok/s; "
          f"{st.steps} steps; device time {dev:.3f} s; wall over device, summed where positive "
          f"{sum(max(0.0, w - d) for w, d, _, _ in rows):.3f} s; growths {len(growths)} "
          f"({sum(g for g, _ in growths):.2f} s)", flush=True)
    classes = {"decode only": lambda p: p == 0, "1-128 prompt tokens": lambda p: 0 < p <= 128,
               "129-256": lambda p: 128 < p <= 256, "257-512": lambda p: p > 256}
    for name, test in classes.items():
        sel = [r for r in rows if test(r[2])]
        if sel:
            print(f"  {name}: {len(sel)} steps, device {sum(r[1] for r in sel):.3f} s "
                  f"(median {statistics.median(r[1] for r in sel) * 1e3:.2f} ms), wall {sum(r[0] for r in sel):.3f} s, "
                  f"mean rows {statistics.fmean(r[3] for r in sel):.1f}, prompt tokens {sum(r[2] for r in sel)}", flush=True)
    for g, need in growths:
        print(f"  growth {g:.2f} s to {need}", flush=True)
    return done


def jobs(n: int):
    """(backend, 128-token prompts, their stop tokens, prompts of 16-512 tokens): stops_ab.py's job
    (its first run, without stops, is also the warm-up) and the varied prompts."""
    backend = stops_ab.backend_4b()
    prompts, stops, _ = stops_ab.job(backend, n)
    cfg = backend.cfg
    rng = np.random.default_rng(11)
    varied = [[cfg.bos_token_id, *rng.integers(3, cfg.vocab_size, int(k) - 1).tolist()] for k in rng.integers(16, 513, n)]
    return backend, prompts, stops, varied


def main() -> None:
    backend, prompts, stops, varied = jobs(int(sys.argv[1]) if len(sys.argv) > 1 else 256)
    for rnd in range(2):
        logged_run(backend, prompts, None, f"round {rnd} 128-token prompts, no stops")
        logged_run(backend, prompts, stops, f"round {rnd} 128-token prompts, stops")
        logged_run(backend, varied, stops, f"round {rnd} 16-512-token prompts, stops")


if __name__ == "__main__":
    main()
