"""Scoring text with a backend: the log-probability of each next token, and perplexity.

Used to measure quality (a quantized format against bf16 weights, one backend against another)
on held-out text. The sequences run through the real engine (paged KV cache, chunked prefill),
with every token's logits returned.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..backends.base import Backend, StepBatch, StepResult
from ..backends.sampler import log_softmax
from ..model.tokenizer import Tokenizer
from .generate import generate_greedy


def heldout_sequences(path: Path, tokenizer: Tokenizer, max_tokens: int = 256, limit: int | None = None) -> list[list[int]]:
    """Token ids (with <bos>, at most `max_tokens`) of each passage of a held-out file: one passage
    per line, `reference<TAB>text` (`sample_data/kjv-heldout.txt`); the first `limit` lines."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()[:limit]
    return [tokenizer.encode(line.split("\t", 1)[-1], add_bos=True)[:max_tokens] for line in lines]


@dataclass(frozen=True)
class Scores:
    """Per sequence: log p(token t+1 | tokens ..t) and the model's top-1 guess for token t+1."""

    logprobs: list[np.ndarray]  # [len - 1] float64 per sequence
    top1: list[np.ndarray]  # [len - 1] int64 per sequence

    @property
    def perplexity(self) -> float:
        """exp of the mean negative log-likelihood over every scored token."""
        return float(np.exp(-np.concatenate(self.logprobs).mean()))

    def top1_agreement(self, other: Scores) -> float:
        """Fraction of positions where both models' most likely next token is the same."""
        mine, theirs = np.concatenate(self.top1), np.concatenate(other.top1)
        return float((mine == theirs).mean())


def fed_logits(indices: list[int], batch: StepBatch, result: StepResult) -> Iterator[tuple[int, int, np.ndarray]]:
    """Each token an `on_step` hook's step fed (`result.logits` asked for): its sequence's index,
    its position, and the logits after it [V]."""
    for s, i in enumerate(indices):
        for t in range(batch.seq_starts[s], batch.seq_starts[s + 1]):
            yield i, int(batch.positions[t]), result.logits[t]


def token_logits(backend: Backend, sequences: list[list[int]], step_token_budget: int = 256) -> list[np.ndarray]:
    """Per sequence (token ids, each starting with <bos>): the logits after each of its tokens but
    the last, [len - 1, V], run through the engine."""
    logits: list[dict[int, np.ndarray]] = [{} for _ in sequences]

    def record(indices: list[int], batch: StepBatch, result: StepResult) -> None:
        for i, position, row in fed_logits(indices, batch, result):
            logits[i][position] = row

    generate_greedy(backend, sequences, 1, step_token_budget=step_token_budget, on_step=record)
    return [np.stack([rows[p] for p in range(len(seq) - 1)]) for seq, rows in zip(sequences, logits)]


def scores_of(sequences: list[list[int]], logits: list[np.ndarray]) -> Scores:
    """The Scores of `sequences` given their `token_logits`."""
    logprobs, top1 = [], []
    for seq, rows in zip(sequences, logits):
        lp = log_softmax(rows)  # [L-1, V]
        logprobs.append(lp[np.arange(len(seq) - 1), seq[1:]])
        top1.append(rows.argmax(axis=1))
    return Scores(logprobs, top1)


def score(backend: Backend, sequences: list[list[int]], step_token_budget: int = 256) -> Scores:
    """Score `sequences` (token ids, each starting with <bos>) on `backend`."""
    return scores_of(sequences, token_logits(backend, sequences, step_token_budget))
