"""Counters the engine keeps while it runs, and the run statistics derived from them."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class EngineStats:
    """What happened over the engine's life: steps, tokens, batch sizes, KV use, preemptions.

    `prefill_tokens` counts tokens fed outside decoding (prompts, and recomputation after a
    preemption); `prompt_tokens_computed` the prompt tokens among them, against the
    `prompt_tokens` that finished requests read (`prompt_tokens_cached` of them from the prefix
    cache); `generated_tokens` counts sampled tokens. A step that feeds any such token counts
    as prefill time (`prefill_seconds`), the others as decode time (`decode_seconds`, with the
    tokens they sampled in `decode_tokens`); a step's time runs from the start of `Engine.step`
    to its end, the device's step when steps are submitted ahead.

    Time to first token of a request runs from its admission into the running batch to the step
    that sampled its first token. Percentiles come from a uniform sample of at most
    `ttft_sample_size` requests (seeded, so the statistics of a run are reproducible).
    """

    steps: int = 0
    prefill_tokens: int = 0
    generated_tokens: int = 0
    batch_size_sum: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    decode_tokens: int = 0
    peak_blocks: dict[str, int] = field(default_factory=dict)
    preemptions: int = 0
    prompt_tokens: int = 0  # of finished requests
    prompt_tokens_cached: int = 0  # of those, taken from the prefix cache
    prompt_tokens_computed: int = 0  # prompt tokens fed to the model (again after a preemption)
    prefix_evictions: int = 0  # cached prefix blocks given up for new tokens (all KV groups)
    ttft_count: int = 0
    ttft_sum: float = 0.0
    ttft_sample: list[float] = field(default_factory=list)
    ttft_sample_size: int = 100_000
    _rng: random.Random = field(default_factory=lambda: random.Random(0), repr=False)

    def record_ttft(self, seconds: float) -> None:
        self.ttft_count += 1
        self.ttft_sum += seconds
        if len(self.ttft_sample) < self.ttft_sample_size:
            self.ttft_sample.append(seconds)
        elif (j := self._rng.randrange(self.ttft_count)) < self.ttft_sample_size:
            self.ttft_sample[j] = seconds

    def record_prompt(self, tokens: int, cached: int) -> None:
        """A request finished with a prompt of `tokens`, `cached` of them from the prefix cache."""
        self.prompt_tokens += tokens
        self.prompt_tokens_cached += cached

    @property
    def prefix_hit_rate(self) -> float:
        """The share of finished requests' prompt tokens taken from the prefix cache."""
        return self.prompt_tokens_cached / self.prompt_tokens if self.prompt_tokens else 0.0

    def record_blocks(self, used: dict[str, int]) -> None:
        for name, n in used.items():
            self.peak_blocks[name] = max(self.peak_blocks.get(name, 0), n)

    def record_step(self, seconds: float, prefill_tokens: int, sampled: int) -> None:
        """A finished step of `seconds` that fed `prefill_tokens` outside decoding and sampled `sampled` tokens."""
        self.steps += 1
        self.prefill_tokens += prefill_tokens
        self.generated_tokens += sampled
        if prefill_tokens:
            self.prefill_seconds += seconds
        else:
            self.decode_seconds += seconds
            self.decode_tokens += sampled

    def merge(self, other: EngineStats) -> None:
        """Add another engine's counts to these (a Ray job's workers, ray_data/cluster.py): sums,
        the larger peaks, the TTFT samples together (cut to the sample size)."""
        for name in ("steps", "prefill_tokens", "generated_tokens", "batch_size_sum", "prefill_seconds", "decode_seconds",
                     "decode_tokens", "preemptions", "prompt_tokens", "prompt_tokens_cached", "prompt_tokens_computed",
                     "prefix_evictions", "ttft_count", "ttft_sum"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name, n in other.peak_blocks.items():
            self.peak_blocks[name] = max(self.peak_blocks.get(name, 0), n)
        self.ttft_sample = (self.ttft_sample + other.ttft_sample)[: self.ttft_sample_size]

    def summary(self, wall_seconds: float) -> dict[str, float | int]:
        """Flat statistics: prefill tokens per second of prefill time, decode tokens per second of
        decode time (class doc), generated tokens per second over `wall_seconds` (the job's
        generation time)."""
        sample = sorted(self.ttft_sample)

        def pct(q: float) -> float:
            return sample[min(len(sample) - 1, int(q * len(sample)))] if sample else 0.0

        def rate(count: float, seconds: float) -> float:
            return count / seconds if seconds > 0 else 0.0

        return {
            "wall_seconds": wall_seconds,
            "steps": self.steps,
            "prefill_tokens": self.prefill_tokens,
            "generated_tokens": self.generated_tokens,
            "prefill_seconds": self.prefill_seconds,
            "decode_seconds": self.decode_seconds,
            "prefill_tokens_per_s": rate(self.prefill_tokens, self.prefill_seconds),
            "decode_tokens_per_s": rate(self.decode_tokens, self.decode_seconds),
            "generated_tokens_per_s": rate(self.generated_tokens, wall_seconds),
            "ttft_mean_s": self.ttft_sum / self.ttft_count if self.ttft_count else 0.0,
            "ttft_p50_s": pct(0.5),
            "ttft_p90_s": pct(0.9),
            "mean_batch_size": self.batch_size_sum / self.steps if self.steps else 0.0,
            "mean_step_ms": 1000 * (self.prefill_seconds + self.decode_seconds) / self.steps if self.steps else 0.0,
            **{f"peak_kv_blocks_{name}": n for name, n in sorted(self.peak_blocks.items())},
            "preemptions": self.preemptions,
            "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_cached": self.prompt_tokens_cached,
            "prompt_tokens_computed": self.prompt_tokens_computed,
            "prefix_hit_rate": self.prefix_hit_rate,
            "prefix_evictions": self.prefix_evictions,
        }
