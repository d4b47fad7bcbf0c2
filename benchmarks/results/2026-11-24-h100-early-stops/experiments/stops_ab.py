"""What submitting steps ahead costs a job whose completions stop early: 256 requests of random
128-token prompts on random 4b weights, run as `gemma-batch run` runs them (at most 32 at once, a
step budget of 512 tokens, so that a finished sequence's slot is refilled with the next prompt),
each stopping on a token of its own at a length between 8 and 128.

The stop tokens come from a first run without stops (sampled at temperature 1 with a key per
request, so that the tokens vary, and every later run draws the same ones: batch invariance): request i stops on the token at a random position p_i of its
completion, i.e. at that token's first occurrence. Then the depths 0, 1 and 2
(GEMMA_BATCH_SCHEDULE_AHEAD) run alternately, three rounds, each checked to give the same
completions: wall time, generated tokens/s, engine steps and the rows they ran (sequences summed
over the steps: rows beyond the tokens kept, and the prompts' steps, are the overhead).

    python3 stops_ab.py [requests] [rounds]"""
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-attention/experiments"))
from common import backend_4b  # noqa: E402
from gemma_batch.bench.runner import bench_kv_plan  # noqa: E402
from gemma_batch.engine.engine import Engine, Request  # noqa: E402
from gemma_batch.engine.sampling_params import SamplingParams  # noqa: E402

BATCH, BUDGET, PROMPT, GEN = 32, 512, 128, 128


def run(backend, prompts, stops, ahead):
    """(wall s, {request: completion ids}, engine stats) of one job at depth `ahead`."""
    engine = Engine(backend, bench_kv_plan(backend, BATCH, PROMPT + GEN, BUDGET), None, BATCH, BUDGET,
                    schedule_ahead=ahead)
    for i, ids in enumerate(prompts):
        engine.add(Request(i, ids, SamplingParams(max_tokens=GEN, temperature=1.0),
                           frozenset(stops[i:i + 1] if stops else ()), rng_key=(i, 7)))
    done, started = {}, time.perf_counter()
    while engine.num_unfinished:
        for c in engine.step():
            done[c.request_id] = c.token_ids
    return time.perf_counter() - started, done, engine.stats


def job(backend, n: int):
    """(prompts, each request's stop token, the completions expected with them) of `n` requests:
    the stop tokens from a run without stops at depth 2 (also the warm-up)."""
    cfg = backend.cfg
    rng = np.random.default_rng(7)
    prompts = [[cfg.bos_token_id, *rng.integers(3, cfg.vocab_size, PROMPT - 1).tolist()] for _ in range(n)]
    wall, free, _ = run(backend, prompts, None, 2)
    print(f"without stops: {n * GEN} tokens in {wall:.2f} s ({n * GEN / wall:,.1f} tok/s)", flush=True)
    positions = rng.integers(8, GEN, n)
    stops = [free[i][p] for i, p in enumerate(positions)]
    lengths = [free[i].index(t) + 1 for i, t in enumerate(stops)]
    print(f"stop lengths: mean {statistics.fmean(lengths):.1f}, median {statistics.median(lengths)}, "
          f"min {min(lengths)}, max {max(lengths)}", flush=True)
    return prompts, stops, {i: free[i][:lengths[i]] for i in range(n)}


def report(label: str, backend, prompts, stops, expect, ahead: int) -> None:
    os.environ["GEMMA_BATCH_SCHEDULE_AHEAD"] = str(ahead)
    wall, done, st = run(backend, prompts, stops, ahead)
    tokens = sum(len(t) for t in done.values())
    print(f"{label} ahead {ahead}: {tokens} tokens in {wall:.3f} s = {tokens / wall:,.1f} tok/s; "
          f"{st.steps} steps, {st.batch_size_sum} rows; completions as expected: {done == expect}", flush=True)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    backend = backend_4b()
    prompts, stops, expect = job(backend, n)
    for rnd in range(rounds):
        for ahead in (2, 1, 0):
            report(f"round {rnd}", backend, prompts, stops, expect, ahead)


if __name__ == "__main__":
    main()
