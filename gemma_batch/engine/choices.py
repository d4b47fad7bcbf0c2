"""Scored choices: a row whose answer is one of a few labels, with each label's probability.

Each choice's log-probability is the sum over its tokens of log p(token | prompt, the choice's
earlier tokens), from the model's logits (a log-softmax over the tokenizer's ids, no temperature:
the backend computes it, `StepBatch.score_tokens`, without reading the logits back). The prompt is
computed once: its last token's logits score every choice's first token; then each choice longer
than one token is fed after the prompt (all but its last token), scored, and taken back (the
sequence returns to its prompt; the next choice overwrites the same KV slots). The answer is the
most probable choice (the first on ties) under greedy, else a draw from the normalised
probabilities with the row's Philox uniform for token 0 (`backends.sampler.uniform`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backends.sampler import draw, uniform
from ..model.tokenizer import Tokenizer
from .sequence import Sequence

MAX_CHOICES = 64


@dataclass(frozen=True)
class Choices:
    """The labels of a row and their token ids (as encoded after the prompt, without <bos>)."""

    texts: tuple[str, ...]
    token_ids: tuple[tuple[int, ...], ...]

    @classmethod
    def encode(cls, texts: tuple[str, ...] | list[str], tokenizer: Tokenizer) -> Choices:
        """ValueError if there are fewer than 2 or more than MAX_CHOICES, or one is empty or repeated."""
        texts = tuple(texts)
        if not 2 <= len(texts) <= MAX_CHOICES:
            raise ValueError(f"choices: give 2 to {MAX_CHOICES} labels, got {len(texts)}")
        if not all(isinstance(t, str) and t for t in texts):
            raise ValueError(f"choices must be non-empty strings, got {texts!r}")
        if len(set(texts)) < len(texts):
            raise ValueError(f"choices are repeated: {sorted(t for t in set(texts) if texts.count(t) > 1)!r}")
        return cls(texts, tuple(tuple(tokenizer.encode(t, add_bos=False)) for t in texts))

    @property
    def longest(self) -> int:
        """Tokens of the longest choice."""
        return max(map(len, self.token_ids))


class ChoiceScores:
    """One row's scoring in progress: which choice is being fed, and every token's log-probability."""

    def __init__(self, choices: Choices, prompt_len: int) -> None:
        self.choices = choices
        self.prompt_len = prompt_len
        self.current = 0  # the choice being fed after the prompt
        self.token_logprobs = [np.full(len(ids), np.nan) for ids in choices.token_ids]

    def tokens_after_prompt(self) -> list[int]:
        """What the sequence holds after its prompt while the current choice is scored."""
        return list(self.choices.token_ids[self.current][:-1])

    def wanted(self, position: int) -> list[int]:
        """The tokens whose log-probabilities after the token at `position` the scoring needs (the
        prompt's last: every choice's first token; else the current choice's next)."""
        if position == self.prompt_len - 1:
            return [ids[0] for ids in self.choices.token_ids]
        return [self.choices.token_ids[self.current][position - self.prompt_len + 1]]

    def record(self, position: int, logprobs: np.ndarray) -> None:
        """Take the log-probabilities of the `wanted(position)` tokens, in their order."""
        if position == self.prompt_len - 1:
            for i, lp in enumerate(logprobs):
                self.token_logprobs[i][0] = lp
        else:
            self.token_logprobs[self.current][position - self.prompt_len + 1] = logprobs[0]

    def next_choice(self) -> bool:
        """Move to the next choice that needs tokens fed (longer than one); False when none is left."""
        self.current += 1
        while self.current < len(self.choices.texts) and len(self.choices.token_ids[self.current]) == 1:
            self.current += 1
        return self.current < len(self.choices.texts)

    def first_choice(self) -> bool:
        """Start at the first choice that needs tokens fed; False when every choice is one token."""
        self.current = -1
        return self.next_choice()

    def rewind(self, seq: Sequence) -> bool:
        """Put the next choice that needs feeding after `seq`'s prompt and set its cache back to the
        prompt (the choice overwrites the same slots); False when none is left."""
        if not self.next_choice():
            return False
        seq.token_ids[seq.num_prompt_tokens:] = self.tokens_after_prompt()
        seq.num_cached_tokens = seq.num_prompt_tokens
        return True

    def result(self, temperature: float, key: tuple[int, int]) -> tuple[int, list[dict]]:
        """(the answer's index, per choice {"choice", "logprob", "probability"} normalised over them)."""
        logprobs = np.array([lps.sum() for lps in self.token_logprobs])
        if np.isnan(logprobs).any():
            raise RuntimeError("a choice was not fully scored")
        probs = np.exp(logprobs - logprobs.max())
        probs /= probs.sum()
        if temperature > 0:
            u = uniform(np.array([key], np.uint32), np.zeros(1, np.uint32))[0]
            pick = draw(np.arange(len(probs)), probs, float(u))
        else:
            pick = int(np.argmax(logprobs))
        return pick, [{"choice": c, "logprob": float(lp), "probability": float(p)}
                      for c, lp, p in zip(self.choices.texts, logprobs, probs)]

