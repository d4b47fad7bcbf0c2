"""How one request is sampled, and the random key that makes its draws batch-invariant."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


MAX_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    """The sampling flags of `gemma-batch run` (and the per-row columns named like them).

    temperature 0 is greedy; top_k 0, top_p 1 and min_p 0 switch those filters off. `stop` strings
    end the completion and are not part of it. `logprobs` K (0 to MAX_LOGPROBS; None: off) reports
    each generated token's log-probability and the K most likely alternatives.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    logprobs: int | None = None

    def __post_init__(self) -> None:
        checks = [
            (self.max_tokens >= 1, "max_tokens must be >= 1", self.max_tokens),
            (0 <= self.temperature < math.inf, "temperature must be finite and >= 0", self.temperature),
            (self.top_k >= 0, "top_k must be >= 0 (0 = off)", self.top_k),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]", self.top_p),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]", self.min_p),
            (0 <= self.seed < 2**63, "seed must be in [0, 2**63)", self.seed),
            (all(self.stop), "stop strings must not be empty", self.stop),
            (self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS, f"logprobs must be in [0, {MAX_LOGPROBS}]",
             self.logprobs),
        ]
        for ok, message, value in checks:
            if not ok:
                raise ValueError(f"{message}, got {value!r}")

    def with_overrides(self, overrides: Mapping[str, Any]) -> SamplingParams:
        """These parameters with a row's overrides (keys named like the fields) applied."""
        return dataclasses.replace(self, **overrides) if overrides else self

    def rng_key(self, row_id: str) -> tuple[int, int]:
        """The Philox key of a row: a hash of (seed, row id), never of its place in the batch."""
        digest = hashlib.blake2b(f"{self.seed}\0{row_id}".encode(), digest_size=8).digest()
        return int.from_bytes(digest[:4], "little"), int.from_bytes(digest[4:], "little")
