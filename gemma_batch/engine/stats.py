"""Counters the engine keeps while it runs, and the run statistics derived from them."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class EngineStats:
    """What happened over the engine's life: steps, tokens, batch sizes, KV use, preemptions.

    `prefill_tokens` counts tokens fed outside decoding (prompts, and recomputation after a
    preemption); `generated_tokens` counts sampled tokens.

    Time to first token of a request runs from its admission into the running batch to the step
    that sampled its first token. Percentiles come from a uniform sample of at most
    `ttft_sample_size` requests (seeded, so the statistics of a run are reproducible).
    """

    steps: int = 0
    prefill_tokens: int = 0
    generated_tokens: int = 0
    batch_size_sum: int = 0
    step_seconds: float = 0.0
    peak_blocks: dict[str, int] = field(default_factory=dict)
    preemptions: int = 0
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

    def record_blocks(self, used: dict[str, int]) -> None:
        for name, n in used.items():
            self.peak_blocks[name] = max(self.peak_blocks.get(name, 0), n)

    def summary(self, wall_seconds: float) -> dict[str, float | int]:
        """Flat statistics: token rates over `wall_seconds` (the job's generation time)."""
        sample = sorted(self.ttft_sample)

        def pct(q: float) -> float:
            return sample[min(len(sample) - 1, int(q * len(sample)))] if sample else 0.0

        wall = max(wall_seconds, 1e-9)
        return {
            "wall_seconds": wall_seconds,
            "steps": self.steps,
            "prefill_tokens": self.prefill_tokens,
            "generated_tokens": self.generated_tokens,
            "prefill_tokens_per_s": self.prefill_tokens / wall,
            "decode_tokens_per_s": self.generated_tokens / wall,
            "ttft_mean_s": self.ttft_sum / self.ttft_count if self.ttft_count else 0.0,
            "ttft_p50_s": pct(0.5),
            "ttft_p90_s": pct(0.9),
            "mean_batch_size": self.batch_size_sum / self.steps if self.steps else 0.0,
            "mean_step_ms": 1000 * self.step_seconds / self.steps if self.steps else 0.0,
            **{f"peak_kv_blocks_{name}": n for name, n in sorted(self.peak_blocks.items())},
            "preemptions": self.preemptions,
        }
