"""What the engine's step loop keeps: per running request (`LiveRequest`) and per step handed
to the backend and not yet taken back (`SubmittedStep`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..backends.base import StepBatch
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
