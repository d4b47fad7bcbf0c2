"""`gemma-batch bench`: the real engine on random weights of a real Gemma 3 shape (or on a real
model's weights, `--model`), timed step by step.

Per run: resolve and create the backend for the weight format (`--weights`) and KV dtype, load
the weights in that format (timed), then per batch size one case: a KV cache for exactly that
batch, a warm-up through the same engine (so pipelines are built and command buffers recorded
before timing; repeated for at least WARMUP_SECONDS, since an idle GPU's clocks need a fraction of
a second under load to rise), the timed run, and at the end one measurement of the device's read bandwidth
(last, so that its buffer stays out of the cases' peak memory).

Each case submits `batch` requests of `prompt_len` random ids at once and runs them greedily to
exactly `gen_len` tokens (no tokenizer, hence no stop token). The step token budget takes every
prompt in one step (up to MAX_STEP_TOKENS), as the peer's `generate` does, so that decode steps
run the whole batch in lockstep.
"""

from __future__ import annotations

import datetime
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TextIO

import numpy as np

from ..backends import create_backend, create_placed, resolve_backend, resolve_placement
from ..backends.base import Backend
from ..backends.placement import parse_placement
from ..engine.engine import Engine, Request
from ..engine.kv_plan import KVPlan, blocks_per_sequence
from ..engine.sampling_params import SamplingParams
from ..engine.stats import EngineStats
from ..model.checkpoint import Tensor
from ..model.config import Gemma3Config
from ..model.quant import QuantizedTensor, WeightFormat, weights_label
from ..model.conversion import converted_nbytes_by_dtype
from ..model.quant_cache import cache_root, load_converted
from ..model.sources import open_model
from ..quantize.calibration import int4_calibration
from .metrics import CaseRun, StepTiming, case_metrics, prefill_flops
from .random_weights import layout as random_layout
from .random_weights import random_tensors
from .report import binary_size
from .shapes import SHAPES, hf_fields, shape_config

BLOCK_SIZE = 16
MAX_STEP_TOKENS = 8192  # bounds the activations of one prefill step
WARMUP_TOKENS = 4
# An idle H100 sat at 345 MHz and first showed its 1,980 MHz 0.16-0.26 s into a 4b decode run
# (nvidia-smi, 2026-11-24; the first 10 steps took 16.2 ms on average, then 5.5): one warm-up round
# at 4b batch 1 lasts about 0.1 s, and the timed runs of some calls had a mean step 0.3-0.4 ms
# above their median.
WARMUP_SECONDS = 0.5


def warm_up(one_round: Callable[[], None]) -> None:
    """Run `one_round` once, then again until WARMUP_SECONDS have passed since that first round
    ended (the bench, the peer and benchmarks/decode_profile.py warm up alike). The first round
    builds pipelines and records command buffers, host work during which the GPU idles: counted in
    the warm-up, it left a fresh process's first case (4b batch 1 on the H100) with its first
    decode steps at low clocks, 15.4 and 7.2 ms against 4.8 (docs/EXPERIMENTS.md, "Jobs with early stops")."""
    one_round()
    started = time.perf_counter()
    while time.perf_counter() - started < WARMUP_SECONDS:  # (true at once: at least one more round)
        one_round()


class BenchError(ValueError):
    """The benchmark cannot run as asked (bad option, or the case does not fit the device)."""


@dataclass(frozen=True)
class BenchOptions:
    shape: str = "1b"
    batches: tuple[int, ...] = (1, 8, 32)
    prompt_len: int = 128
    gen_len: int = 128
    backend: str = "auto"
    device: str | None = None
    bandwidth_bytes: int = 1 << 30
    seed: int = 0
    weights: WeightFormat = WeightFormat()
    kv_dtype: str | None = None  # None: the backend's default
    place: str | None = None  # a placement plan (backends/placement.py) instead of `backend` and `device`
    model: str | None = None  # a real model (as `run --model` takes it) instead of random weights of `shape`


@dataclass(frozen=True)
class BenchWeights:
    """What a run times: random weights of a shape, or a real model's."""

    name: str  # the shape, or the --model value
    source: str  # "random" or "checkpoint"
    cfg: Gemma3Config
    layout: Mapping[str, tuple[str, tuple[int, ...]]]  # as `Checkpoint.layout`
    label: str  # the weights as they run (`weights_label`)
    config: dict  # the report's: Hugging Face `Gemma3TextConfig` fields
    tensors: Callable[[], Iterator[tuple[str, Tensor | QuantizedTensor]]]


def bench_weights(options: BenchOptions, log: TextIO) -> BenchWeights:
    """The run's weights: `options.model`'s (opened as `run` opens it: converted or fetched once,
    said on `log`), else random ones of `options.shape`."""
    fmt = options.weights
    if options.model is None:
        cfg = shape_config(options.shape)
        layout = random_layout(cfg)
        return BenchWeights(options.shape, "random", cfg, layout, weights_label(fmt, layout), SHAPES[options.shape],
                            lambda: random_tensors(cfg, options.seed, fmt))
    _, cfg, tokenizer, checkpoint = open_model(options.model, log)
    return BenchWeights(options.model, "checkpoint", cfg, checkpoint.layout, weights_label(fmt, checkpoint.layout), hf_fields(cfg),
                        lambda: load_converted(checkpoint, fmt, cache_root(), int4_calibration(fmt, tokenizer, cfg)).tensors)


def run_bench(options: BenchOptions, command: str = "", log: TextIO | None = None) -> dict:
    """Run every case; return the report: `{"run": metadata, "cases": [one dict per batch size]}`."""
    log = log or sys.stderr
    weights = bench_weights(options, log)
    cfg = weights.cfg
    _check(options, weights)
    fmt = options.weights
    try:
        if options.place is not None:
            placement, why = resolve_placement(parse_placement(options.place, cfg.num_layers)), "--place"
            backend = create_placed(placement, cfg, weights.layout, fmt, options.kv_dtype)
        else:
            backend_name, why = resolve_backend(options.backend, options.device)
            backend = create_backend(backend_name, cfg, options.device, options.kv_dtype, fmt.name)
    except ValueError as e:  # the backend lacks the weight format or the KV dtype; a bad plan
        raise BenchError(str(e)) from None
    print(f"backend: {backend.identity} ({why}); weights {weights.label}", file=log)

    by_dtype = converted_nbytes_by_dtype(weights.layout, fmt)
    nbytes = sum(by_dtype.values())
    held, available = backend.weight_bytes(by_dtype), backend.available_memory()
    if held >= available:
        raise BenchError(f"the {weights.name} weights in {weights.label} take {held / 2**30:.2f} GiB on "
                         f"{backend.identity} but only {available / 2**30:.2f} GiB is free there")
    started = time.perf_counter()
    backend.load_weights(weights.tensors())
    load_s = time.perf_counter() - started
    print(f"weights: {weights.source} {weights.name}, {binary_size(nbytes)} {weights.label}, loaded in {load_s:.1f} s",
          file=log)

    runs = []
    for batch in options.batches:
        print(f"batch {batch}: warm-up and timed run", file=log)
        runs.append(run_case(backend, batch, options.prompt_len, options.gen_len, options.seed))
    print(f"bandwidth: streaming read of {binary_size(options.bandwidth_bytes)}", file=log)
    bandwidth = backend.measure_read_bandwidth(options.bandwidth_bytes)

    groups = cfg.kv_groups()
    kv_per_token = {g.name: backend.kv_bytes_per_token(g.name) for g in groups}
    return {
        "run": {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command,
            "backend": backend.identity,
            "backend_choice": why,
            "shape": weights.name,
            "weights_source": weights.source,
            "config": weights.config,
            "weights": weights.label,
            "kv_dtype": backend.kv_dtype,
            "seed": options.seed,
            "block_size": BLOCK_SIZE,
            "weight_bytes": nbytes,
            "weight_bytes_by_dtype": by_dtype,
            "weight_load_s": load_s,
            "kv_bytes_per_token": kv_per_token,
            "bandwidth_test_bytes": options.bandwidth_bytes,
            "bandwidth_bytes_per_s": bandwidth,
        },
        "cases": [case_metrics(run, groups, kv_per_token, nbytes, bandwidth, prefill_flops(cfg, run.prompt_len))
                  for run in runs],
    }


def run_case(backend: Backend, batch: int, prompt_len: int, gen_len: int, seed: int = 0) -> CaseRun:
    """Warm up, then time `batch` requests of `prompt_len` + `gen_len` tokens through a fresh engine."""
    cfg, length = backend.cfg, prompt_len + gen_len
    engine = bench_engine(backend, batch, prompt_len, gen_len)
    rng, warm_rng = np.random.default_rng(seed), np.random.default_rng([seed, 1])
    # The warm-up reaches the run's longest context, so no buffer grows (and nothing is recorded again) later.
    warm_gen = min(gen_len, WARMUP_TOKENS)

    def one_round() -> None:  # `batch` requests
        for i in range(batch):
            engine.add(_request(warm_rng, cfg, i, length - warm_gen, warm_gen))
        while engine.num_unfinished:
            engine.step()

    warm_up(one_round)

    engine.stats = stats = EngineStats()  # count the timed run alone
    for i in range(batch):
        engine.add(_request(rng, cfg, batch + i, prompt_len, gen_len))
    steps, started = [], time.perf_counter()
    while engine.num_unfinished:
        before = (stats.prefill_tokens, stats.generated_tokens, stats.ttft_count)
        step_start = time.perf_counter()
        engine.step()
        end = time.perf_counter()
        steps.append(StepTiming(end - started, end - step_start, backend.last_step_device_seconds(),
                                stats.prefill_tokens - before[0], stats.generated_tokens - before[1],
                                stats.ttft_count - before[2]))
    return CaseRun(batch, prompt_len, gen_len, engine.scheduler.step_token_budget, steps, stats.prefill_tokens,
                   stats.generated_tokens, stats.preemptions, backend.peak_memory())


def step_budget(batch: int, prompt_len: int) -> int:
    """Tokens a step may take: every prompt at once, up to MAX_STEP_TOKENS (at least one per sequence)."""
    return max(batch, min(batch * prompt_len, MAX_STEP_TOKENS))


def bench_engine(backend: Backend, batch: int, prompt_len: int, gen_len: int) -> Engine:
    """An engine for `batch` requests of `prompt_len` + `gen_len` tokens at once, with the bench's
    step budget (`step_budget`) and a KV cache of exactly that many sequences (`bench_kv_plan`)."""
    budget, length = step_budget(batch, prompt_len), prompt_len + gen_len
    return Engine(backend, bench_kv_plan(backend, batch, length, min(budget, length)), None, batch, budget)


def bench_kv_plan(backend: Backend, batch: int, length: int, max_chunk: int) -> KVPlan:
    """KV blocks for `batch` sequences of `length` tokens at once, plus one spare block each: the
    scheduler admits a sequence only while a block per running sequence stays free, and a
    benchmark must neither hold sequences back nor preempt them."""
    groups = backend.cfg.kv_groups()
    per_token: Mapping[str, int] = {g.name: backend.kv_bytes_per_token(g.name) for g in groups}
    blocks = {g.name: batch * (blocks_per_sequence(g, length, BLOCK_SIZE, max_chunk) + 1) for g in groups}
    for g in groups:
        limit = backend.max_kv_blocks(g.name, BLOCK_SIZE)
        if limit is not None and blocks[g.name] > limit:
            raise BenchError(f"batch {batch} of {length} tokens needs {blocks[g.name]} {g.name} KV blocks; "
                             f"{backend.identity} holds at most {limit} in one buffer")
    used, available = sum(n * BLOCK_SIZE * per_token[name] for name, n in blocks.items()), backend.available_memory()
    if used > available:
        raise BenchError(f"batch {batch} of {length} tokens needs {used / 2**30:.2f} GiB of KV cache but only "
                         f"{available / 2**30:.2f} GiB is free on {backend.identity} after the weights")
    return KVPlan(BLOCK_SIZE, blocks, length, available, used, batch)


def prefilled_engine(backend: Backend, batch: int, prompt_len: int, gen_len: int, seed: int = 0) -> Engine:
    """An engine with `batch` random requests of `prompt_len` + `gen_len` tokens whose prefill is
    done: what remains are decode steps (for the scripts in benchmarks/). The prefill takes one step
    up to MAX_STEP_TOKENS prompt tokens, more beyond (`bench_engine`)."""
    engine = bench_engine(backend, batch, prompt_len, gen_len)
    rng = np.random.default_rng(seed)
    for i in range(batch):
        engine.add(_request(rng, backend.cfg, i, prompt_len, gen_len))
    while engine.num_unfinished and engine.stats.ttft_count < batch:  # a first token ends a prefill
        engine.step()
    return engine


def _request(rng: np.random.Generator, cfg: Gemma3Config, request_id: int, prompt_len: int, gen_len: int) -> Request:
    """<bos> and random ids, run greedily to exactly `gen_len` tokens."""
    ids = [cfg.bos_token_id, *rng.integers(3, cfg.vocab_size, prompt_len - 1).tolist()]
    return Request(request_id, ids, SamplingParams(max_tokens=gen_len))


def _check(options: BenchOptions, weights: BenchWeights) -> None:
    cfg = weights.cfg
    problems = [
        (bool(options.batches) and min(options.batches) >= 1, f"batch sizes must be >= 1, got {list(options.batches)}"),
        (options.prompt_len >= 1, f"--prompt-len must be >= 1, got {options.prompt_len}"),
        (options.gen_len >= 1, f"--gen-len must be >= 1, got {options.gen_len}"),
        (options.prompt_len + options.gen_len <= cfg.max_position_embeddings,
         f"prompt + generated tokens {options.prompt_len + options.gen_len} exceed the {weights.name} context "
         f"of {cfg.max_position_embeddings}"),
        (options.bandwidth_bytes >= 1 << 20,
         f"--bandwidth-bytes must be at least 1 MiB, got {options.bandwidth_bytes}"),
    ]
    bad = [message for ok, message in problems if not ok]
    if bad:
        raise BenchError("; ".join(bad))
