"""What the engine's step loop keeps: per running request (`LiveRequest`: its text, cut at a
stop string) and per step handed to the backend and not yet taken back (`SubmittedStep`, and
which of its sequences came back with logits that are not finite)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..backends.base import NON_FINITE, StepBatch, StepResult
from ..model.detokenizer import IncrementalDetokenizer
from .read_back import ReadBack
from .request import Request
from .sequence import Sequence


@dataclass
class LiveRequest:
    """Engine-side state of a running request: its text so far and when it was admitted."""

    request: Request
    detok: IncrementalDetokenizer | None
    text: str = ""
    admitted_at: float | None = None
    logprobs: list[dict] | None = None  # per generated token, where the request asks (`token_logprobs`)
    stopped_by_string: bool = field(default=False)

    def add_text(self, token: int) -> bool:
        """Detokenize `token` onto the text (with a tokenizer); True where the text now holds one
        of the request's stop strings, the text then cut before it."""
        if self.detok is None:
            return False
        before = len(self.text)
        self.text += self.detok.add(token)
        stops = self.request.params.stop
        if not stops or len(self.text) == before:
            return False
        start = max(0, before - max(len(s) for s in stops) + 1)  # a stop string may straddle earlier text
        hits = [i for s in stops if (i := self.text.find(s, start)) >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped_by_string = True
        return bool(hits)


@dataclass
class SubmittedStep:
    """A step handed to the backend: its sequences (and tokens each), and which of them it samples
    (index in the step, sequence, whether it is the sequence's first completion token)."""

    scheduled: list[tuple[Sequence, int]]
    batch: StepBatch
    sampled: list[tuple[int, Sequence, bool]]
    prefill_tokens: int  # tokens it feeds outside decoding, counted in the stats when it is waited for
    reads: ReadBack = field(default_factory=ReadBack)  # what it reads back for scored choices and logprobs
    held: bool = False  # whether its sampled sequences hold the places of their coming tokens


def non_finite(step: SubmittedStep, result: StepResult) -> set[int]:
    """The live sequences of `step` whose logits held a NaN or +inf: a sampled id of NON_FINITE,
    or a choice score they asked for that is not finite."""
    bad = {seq.seq_id for s, seq, _ in step.sampled if result.token_ids[s] == NON_FINITE and not seq.finished}
    if step.reads.scored and not np.isfinite(result.scores).all():
        bad |= {seq.seq_id for first, n, seq, _ in step.reads.scored if not np.isfinite(result.scores[first: first + n]).all()}
    return bad
