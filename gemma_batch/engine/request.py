"""What the engine takes and gives back: a request (a prompt and how to complete it) and its
completion."""

from __future__ import annotations

from dataclasses import dataclass

from .choices import Choices
from .constraints import Matcher
from .sampling_params import SamplingParams


class NonFiniteLogits(RuntimeError):
    """A step computed NaN or infinite logits for some requests (`request_ids`): the model's
    weights are corrupt, or its arithmetic overflowed. Nothing from that step was taken."""

    def __init__(self, request_ids: list[int]) -> None:
        super().__init__(f"non-finite logits (NaN or infinity) for request(s) {', '.join(map(str, request_ids[:8]))}"
                         f"{', ...' if len(request_ids) > 8 else ''}")
        self.request_ids = request_ids


@dataclass
class Request:
    """One prompt to complete. `request_id` is unique among the engine's requests."""

    request_id: int
    prompt_ids: list[int]
    params: SamplingParams = SamplingParams()
    stop_token_ids: frozenset[int] = frozenset()
    rng_key: tuple[int, int] = (0, 0)
    max_new_tokens: int | None = None  # None: params.max_tokens (callers clamp to the context)
    matcher: Matcher | None = None  # a constrained completion's grammar (`engine.constraints`)
    choices: Choices | None = None  # the answer is one of these, scored (`engine.choices`)

    @property
    def max_new(self) -> int:
        """The most tokens its sequence adds to the prompt: its longest choice, where scored."""
        if self.choices is not None:
            return self.choices.longest
        return self.params.max_tokens if self.max_new_tokens is None else self.max_new_tokens


@dataclass
class Completion:
    request_id: int
    token_ids: list[int]  # every generated token, the stop token included
    text: str  # the completion, without a stop token or stop string
    finish_reason: str  # "stop" or "length"
    num_prompt_tokens: int
    choice_logprobs: list[dict] | None = None  # per choice: {"choice", "logprob", "probability"}
    logprobs: list[dict] | None = None  # per generated token, where asked (`engine.token_logprobs`)
    cached_prompt_tokens: int = 0  # of its prompt tokens, those taken from the prefix cache
