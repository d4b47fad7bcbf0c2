"""From the timed steps of one benchmark case to its figures, and the decode roofline they are judged by.

A decode step reads every weight once, as the run's weight format stores it (the tied embedding
once: the LM head reads it whole, the lookup only a row per sequence): an int8 / int4 matrix's
codes and its scales, a bf16 / fp16 one 2 bytes a weight, norm weights as stored
(`random_weights.weight_bytes`). It also reads, per sequence and KV group, the K/V of the tokens
it attends to, at the KV dtype's bytes per token (int8's scales included;
`Backend.kv_bytes_per_token`). The roofline is that many bytes at the measured read bandwidth:

    decode bytes per step  = weight bytes + batch * sum_groups min(context, window) * KV bytes per token
    roofline tokens/s      = batch * bandwidth / decode bytes per step
    bandwidth fraction     = decode tokens/s / roofline tokens/s

with `context` the mean context of a decode step (prompt + gen/2: a sequence's decode steps see
prompt + 1 ... prompt + gen - 1 tokens).

Prefill is judged by the matrix units instead: `prefill_tflops` counts the products a prompt needs
(`prefill_flops`), not what a backend happens to compute, so it compares across engines.

Decode tokens/s (and so the fraction) is over the mean step; the step times shown are medians. Where
they part, a few steps were slow: `slow_decode_steps` counts the decode steps over SLOW_STEP times the
median wall step, and `slow_decode_steps_on_device` those of them whose device time was also over
SLOW_STEP times its median (the GPU itself was slow; the others waited on the host).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from ..model.config import Gemma3Config, KVGroup
from ..model.weights import layer_tensor_shapes

SLOW_STEP = 1.2  # a decode step over 1.2x the median: the median step of 4b on the H100 varies ~1% between runs


@dataclass(frozen=True)
class StepTiming:
    """One engine step of the timed run: its times and what the engine counted in it."""

    end_s: float  # since the run started (every request was submitted then)
    wall_s: float  # perf_counter around `engine.step()`
    device_s: float | None  # `backend.last_step_device_seconds()`; None where device and host are one
    prefill_tokens: int  # prompt tokens fed in the step (0: a decode-only step)
    sampled_tokens: int
    first_tokens: int  # requests whose first token the step sampled


@dataclass(frozen=True)
class CaseRun:
    """What one timed run of `batch` requests measured, before any derivation."""

    batch: int
    prompt_len: int
    gen_len: int
    step_token_budget: int
    steps: list[StepTiming]
    prefill_tokens: int  # engine counters over the run
    generated_tokens: int
    preemptions: int
    peak_memory_bytes: int  # backend.peak_memory() after the run


def decode_kv_bytes(groups: tuple[KVGroup, ...], bytes_per_token: Mapping[str, int], batch: int,
                    context: float) -> int:
    """KV bytes one decode step reads: each sequence's K/V of the min(context, window) tokens it sees."""
    per_seq = sum((context if g.window is None else min(context, g.window)) * bytes_per_token[g.name]
                  for g in groups)
    return round(batch * per_seq)


def prefill_flops(cfg: Gemma3Config, prompt_len: int) -> int:
    """Multiply-adds x 2 that one sequence's prompt of `prompt_len` tokens needs: per token and layer
    the qkv, o, gate, up and down products, per layer the causal attention (Q.K^T and P.V over the
    keys each query sees: all before it, at most the window on sliding layers), and the LM head once,
    for the last token's logits. Norms, RoPE and softmax are left out."""
    linear = 2 * sum(math.prod(shape) for shape in layer_tensor_shapes(cfg).values() if len(shape) == 2)  # a token, a layer
    keys = {None: prompt_len * (prompt_len + 1) // 2}
    for g in cfg.kv_groups():
        if g.window is not None:
            w = min(g.window, prompt_len)  # token t (0-based) sees min(t + 1, window) keys
            keys[g.window] = w * (w + 1) // 2 + (prompt_len - w) * w
    attention = sum(4 * cfg.q_width * keys[g.window] * len(g.layers) for g in cfg.kv_groups())
    return prompt_len * cfg.num_layers * linear + attention + 2 * cfg.hidden_size * cfg.vocab_size


def roofline_tokens_per_s(batch: int, bytes_per_step: int, bandwidth: float) -> float:
    """Decode tokens/s if each step took only the time to stream its bytes at `bandwidth` bytes/s."""
    return batch * bandwidth / bytes_per_step


def _median_ms(values: list[float]) -> float | None:
    return 1000 * statistics.median(values) if values else None


def _mean_ms(values: list[float]) -> float | None:
    return 1000 * statistics.fmean(values) if values else None


def slow_steps(decode: list[StepTiming]) -> tuple[int, int | None]:
    """(decode steps over SLOW_STEP x the median wall step, how many of them were also over SLOW_STEP x
    the median device step; None without device times)."""
    if not decode:
        return 0, None
    wall = statistics.median(s.wall_s for s in decode)
    slow = [s for s in decode if s.wall_s > SLOW_STEP * wall]
    if any(s.device_s is None for s in decode):
        return len(slow), None
    device = statistics.median(s.device_s for s in decode)
    return len(slow), sum(s.device_s > SLOW_STEP * device for s in slow)


def case_metrics(run: CaseRun, groups: tuple[KVGroup, ...], kv_bytes_per_token: Mapping[str, int],
                 weight_bytes: int, bandwidth: float, flops_per_prompt: int | None = None) -> dict:
    """The case's JSON row (units in the names; None where a figure does not apply). `weight_bytes`:
    every weight in the run's format; `kv_bytes_per_token`: per KV group, at the run's KV dtype;
    `flops_per_prompt`: `prefill_flops` of one request's prompt."""
    steps = run.steps
    prefill = [s for s in steps if s.prefill_tokens]
    decode = [s for s in steps if not s.prefill_tokens]
    wall = steps[-1].end_s
    first_token_times = [s.end_s for s in steps for _ in range(s.first_tokens)]
    prefill_s = sum(s.wall_s for s in prefill)
    decode_wall = sum(s.wall_s for s in decode)
    decode_tps = sum(s.sampled_tokens for s in decode) / decode_wall if decode else None
    timed = [s for s in decode if s.device_s is not None]
    device_ms = _median_ms([s.device_s for s in timed])
    # A step submitted ahead can take less wall time than GPU time (part of its GPU work ran during
    # the call before): none of its host time was exposed, so it counts 0, not a negative time.
    host_ms = _median_ms([max(0.0, s.wall_s - s.device_s) for s in timed])

    slow, slow_on_device = slow_steps(decode)
    context = run.prompt_len + run.gen_len / 2
    kv_bytes = decode_kv_bytes(groups, kv_bytes_per_token, run.batch, context)
    step_bytes = weight_bytes + kv_bytes
    roofline = roofline_tokens_per_s(run.batch, step_bytes, bandwidth)
    return {
        "batch": run.batch,
        "prompt_len": run.prompt_len,
        "gen_len": run.gen_len,
        "step_token_budget": run.step_token_budget,
        "steps": len(steps),
        "prefill_steps": len(prefill),
        "decode_steps": len(decode),
        "prefill_tokens": run.prefill_tokens,
        "generated_tokens": run.generated_tokens,
        "preemptions": run.preemptions,
        "wall_s": wall,
        "e2e_tokens_per_s": run.generated_tokens / wall,
        "prefill_tokens_per_s": run.prefill_tokens / prefill_s,
        "prefill_tflops": run.batch * flops_per_prompt / prefill_s / 1e12 if flops_per_prompt else None,
        "ttft_mean_s": statistics.fmean(first_token_times),
        "ttft_max_s": max(first_token_times),
        "decode_tokens_per_s": decode_tps,
        "decode_step_ms_median": _median_ms([s.wall_s for s in decode]),
        "decode_device_ms_median": device_ms,
        "decode_step_ms_mean": _mean_ms([s.wall_s for s in decode]),
        "decode_device_ms_mean": _mean_ms([s.device_s for s in timed]),
        "decode_step_ms_max": 1000 * max(s.wall_s for s in decode) if decode else None,
        "slow_decode_steps": slow,
        "slow_decode_steps_on_device": slow_on_device,
        "host_ms_per_decode_step": host_ms,
        "host_percent_of_device": 100 * host_ms / device_ms if timed else None,
        "peak_memory_bytes": run.peak_memory_bytes,
        "mean_decode_context": context,
        "kv_bytes_per_decode_step": kv_bytes,
        "decode_bytes_per_step": step_bytes,
        "roofline_decode_tokens_per_s": roofline,
        "bandwidth_fraction": decode_tps / roofline if decode else None,
    }
