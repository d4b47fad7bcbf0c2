"""What one step carries between the engine and a backend (`base.Backend.step`): the batch of
tokens with their KV slots and sampling parameters, and the result. base.py's docstring gives the
KV layout the slots and block tables address.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class SamplingBatch:
    """Per-sequence sampling parameters of a step (see `backends.sampler` for the exact rule).

    Randomness is counter-based: the uniform number for a sequence's draw is a pure function of
    its `keys` row (derived from the job seed and the row id) and `counters` (the index of the
    token being sampled), so it never depends on the batch.
    """

    temperature: np.ndarray  # [S] float32, 0 = greedy
    top_k: np.ndarray  # [S] int32, 0 = off
    top_p: np.ndarray  # [S] float32, 1 = off
    min_p: np.ndarray  # [S] float32, 0 = off
    keys: np.ndarray  # [S, 2] uint32 Philox key of each sequence
    counters: np.ndarray  # [S] uint32, index of the completion token being drawn
    vocab_size: int = 0  # draw only ids below this (0: any); 4B+ checkpoints have padding rows
    # [S, ceil(V / 32)] int32 or None: bit j of word w allows token 32 w + j (a constrained
    # completion's grammar, `engine.constraints`); -1 words allow all. None: every token allowed.
    allowed: np.ndarray | None = None
    # `allowed` comes after `Backend.submit`, through `Backend.allow`, computed on the host while
    # the device runs the step; its draws wait for it.
    masks_follow: bool = False


@dataclass
class StepBatch:
    """One step over a flattened ("varlen") batch of S sequences and T tokens.

    Prefill chunks and single decode tokens are mixed; sequence s owns the flat token range
    `seq_starts[s]:seq_starts[s+1]`, whose positions are consecutive and end at
    `context_lens[s] - 1`.
    """

    token_ids: np.ndarray  # [T] int32
    positions: np.ndarray  # [T] int32, index of each token in its sequence (<bos> is 0)
    seq_starts: np.ndarray  # [S+1] int32
    context_lens: np.ndarray  # [S] int32, tokens in the sequence's cache after this step
    block_tables: dict[str, np.ndarray]  # KV group -> [S, max_blocks] int32 block ids, -1 = none
    slots: dict[str, np.ndarray]  # KV group -> [T] int32 slot where each new token's K/V goes
    sample: np.ndarray  # [S] bool, whether the sequence's last token this step is sampled
    sampling: SamplingBatch | None = None  # None: greedy for every sequence
    return_logits: bool = False  # also return the logits of every token (tests, scoring)
    # [T] int32 or None: -1 where `token_ids` holds the token; s >= 0 where the token is the one
    # the step submitted just before this one samples for its sequence s (token_ids has
    # sequence.PENDING there). Lets the engine submit a step before the one before it finished.
    token_sources: np.ndarray | None = None
    # [S] int32 or None: each sequence's prompt length. A backend may run the attention and the
    # products of prompt tokens (positions below it) on other kernels than those of the rest, in
    # other summation orders, as long as the choice depends on the token alone (batch invariance).
    # A sequence's tokens in a step are all prompt tokens or none, and the sequences of prompt
    # tokens come after the others (the engine's scheduler keeps this). None: no prompt tokens.
    prompt_lens: np.ndarray | None = None
    # [R] int32 or None: flat token indices whose logits come back in `StepResult.row_logits`
    # (a token's log-probabilities, `engine.token_logprobs`), besides what `return_logits` asks for.
    logit_rows: np.ndarray | None = None
    # [P] int32 each, or None: the log-probability of token `score_ids[p]` after flat token
    # `score_tokens[p]` comes back in `StepResult.scores` [P]: a log-softmax of that token's logits
    # over the ids below the sampling vocabulary (no temperature, no mask; `sampler.log_softmax`),
    # without its row of logits read back (scoring a row's choices, `engine.choices`).
    score_tokens: np.ndarray | None = None
    score_ids: np.ndarray | None = None

    def sourced_tokens(self, values: np.ndarray) -> np.ndarray:
        """`token_ids` with each token named by `token_sources` taken from `values` [S of the
        step before] at its sequence there."""
        if self.token_sources is None:
            return self.token_ids
        fed = self.token_sources >= 0
        out = self.token_ids.copy()
        out[fed] = values[self.token_sources[fed]]
        return out

    def score_rows(self) -> np.ndarray:
        """The flat tokens of `score_tokens`, each once, ascending (empty without scores). Sorted
        by hand: numpy 2.4's np.unique took 12-19 ms on its first call in a process."""
        if self.score_tokens is None:
            return np.zeros(0, np.int32)
        tokens = np.sort(self.score_tokens)
        return tokens[np.concatenate([[True], tokens[1:] != tokens[:-1]])]

    def prompt_mask(self) -> np.ndarray:
        """[T] bool: the tokens whose positions are below their sequence's prompt length."""
        if self.prompt_lens is None:
            return np.zeros(self.num_tokens, bool)
        return self.positions < np.repeat(np.asarray(self.prompt_lens), np.diff(self.seq_starts))

    def prompt_start(self, prompt: np.ndarray | None = None) -> int:
        """The first prompt token (T: none; `prompt`: `prompt_mask()` if already made); ValueError
        if prompt tokens do not come last, every sequence's tokens all prompt tokens or none (the
        contract on `prompt_lens`)."""
        prompt = self.prompt_mask() if prompt is None else prompt
        start = len(prompt) - int(prompt.sum())
        if not prompt[start:].all():
            raise ValueError("a step's prompt tokens must come after its other tokens, and a sequence's tokens in a "
                             "step must be all prompt tokens or none (StepBatch.prompt_lens; the engine's scheduler "
                             "keeps this)")
        return start

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


NON_FINITE = -2  # StepResult.token_ids of a sequence whose logits held a NaN or +inf (corrupt weights, overflow)


@dataclass
class StepResult:
    """What comes back from a step: only the sampled ids, unless logits were asked for."""

    token_ids: np.ndarray  # [S] int32: the next token of each sampled sequence, -1 elsewhere, NON_FINITE
    logits: np.ndarray | None = None  # [T, V] float32 when `StepBatch.return_logits`
    row_logits: np.ndarray | None = None  # [R, V] float32 of `StepBatch.logit_rows`, in their order
    scores: np.ndarray | None = None  # [P] float64 of `StepBatch.score_tokens`, in their order
