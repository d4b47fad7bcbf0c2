"""Perplexity of a text, in windows, as `gemma-batch perplexity` measures it to choose a format.

The text is tokenized whole (no <bos>), then cut into windows of `context` tokens starting every
`stride` tokens, each run as <bos> + its tokens. A window scores only the tokens no earlier window
scored (with stride = context, the default, every token once; a smaller stride gives each scored
token more context, as transformers' strided perplexity does):

    text   t0 t1 t2 t3 t4 t5 t6 t7 t8 t9          context 4, stride 4
    window <bos> t0 t1 t2 t3   scores t0..t3 (t0 from <bos> alone)
    window <bos> t4 t5 t6 t7   scores t4..t7
    window <bos> t8 t9         scores t8, t9

Per scored token it keeps the log-probability of the text's token, the most likely token and the
`top_k` most likely (ids and log-probabilities), never a window's whole logits (a 262,144-piece
vocabulary makes those 1 MiB a token). Against a reference run of the same tokens (an earlier
run's JSON, or another model or format run first) it adds the top-1 agreement and the mean KL
divergence KL(reference || this run) over the reference's top-k tokens and one bucket for all
others: the divergence of those coarser distributions, never more than the full one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backends.base import Backend, StepBatch, StepResult
from ..backends.sampler import log_softmax
from .generate import generate_greedy
from .score import fed_logits

TINY = 1e-30  # floor of a probability before its logarithm


@dataclass(frozen=True)
class Window:
    """One run of the model: <bos> + text tokens; the tokens from `first_scored` on are scored."""

    ids: list[int]  # [1 + n]: <bos>, then the window's text tokens
    first_scored: int  # index into the text tokens (0..n): those before it an earlier window scored


def text_windows(ids: list[int], bos: int, context: int, stride: int) -> list[Window]:
    """The windows of text tokens `ids` (module docstring). ValueError for a stride above the
    context or a text of no token."""
    if context < 1 or not 1 <= stride <= context:
        raise ValueError(f"need 1 <= stride <= context, got stride {stride} and context {context}")
    if not ids:
        raise ValueError("the text has no token")
    windows, scored_to = [], 0
    for start in range(0, len(ids), stride):
        tokens = ids[start: start + context]
        windows.append(Window([bos, *tokens], scored_to - start))
        scored_to = start + len(tokens)
        if scored_to == len(ids):
            break
    return windows


@dataclass(frozen=True)
class TokenScores:
    """Per scored token, in text order."""

    token_ids: np.ndarray  # [N] int64: the text's tokens
    logprobs: np.ndarray  # [N] float64: log p(token | what precedes it in its window)
    top_ids: np.ndarray  # [N, K] int64: the K most likely tokens, most likely first
    top_logprobs: np.ndarray  # [N, K] float64: their log-probabilities
    at_reference: np.ndarray | None = None  # [N, K] float64: log p of a reference's top ids (compare_to)

    @property
    def perplexity(self) -> float:
        """exp of the mean negative log-likelihood over the scored tokens."""
        return float(np.exp(-self.logprobs.mean()))


def score_windows(backend: Backend, windows: list[Window], top_k: int, reference_ids: np.ndarray | None = None,
                  max_batch: int = 8, step_tokens: int = 256) -> TokenScores:
    """Run `windows` through the engine (`max_batch` at a time, steps of at most `step_tokens`,
    whose logits [tokens, V] are read back whole) and keep each scored token's figures; with
    `reference_ids` [N, K], also this run's log-probabilities of those ids."""
    offsets = np.cumsum([0] + [len(w.ids) - 1 - w.first_scored for w in windows])  # [W + 1]: a window's first row
    n = int(offsets[-1])
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    k = top_k
    token_ids = np.zeros(n, np.int64)
    logprobs, top_lp = np.zeros(n), np.zeros((n, k))
    top_ids = np.zeros((n, k), np.int64)
    at_ref = None if reference_ids is None else np.zeros(reference_ids.shape)
    seen = np.zeros(n, bool)

    def record(seq_ids: list[int], batch: StepBatch, result: StepResult) -> None:
        for w, position, logits in fed_logits(seq_ids, batch, result):  # logits at position p predict token p + 1
            if windows[w].first_scored <= position < len(windows[w].ids) - 1:
                keep(w, position, logits)

    def keep(w: int, position: int, logits: np.ndarray) -> None:
        window = windows[w]
        row = offsets[w] + position - window.first_scored
        lp = log_softmax(logits)  # [V] float64
        token_ids[row] = nxt = window.ids[position + 1]
        logprobs[row] = lp[nxt]
        best = np.argpartition(-lp, k - 1)[:k]
        top_ids[row] = best[np.argsort(-lp[best], kind="stable")]
        top_lp[row] = lp[top_ids[row]]
        if at_ref is not None:
            at_ref[row] = lp[reference_ids[row]]
        seen[row] = True

    generate_greedy(backend, [w.ids for w in windows], 1, step_token_budget=step_tokens, on_step=record,
                    max_batch=max_batch, num_blocks=_blocks(backend, windows, max_batch))
    if not seen.all():
        raise RuntimeError(f"{int((~seen).sum())} of {n} tokens got no logits")
    return TokenScores(token_ids, logprobs, top_ids, top_lp, at_ref)


def _blocks(backend: Backend, windows: list[Window], max_batch: int, block_size: int = 16) -> dict[str, int]:
    """KV blocks for `max_batch` of the longest window (+ the one token generated) at once."""
    per_seq = -(-(max(len(w.ids) for w in windows) + 1) // block_size)
    return {g.name: per_seq * min(max_batch, len(windows)) for g in backend.cfg.kv_groups()}


@dataclass(frozen=True)
class Comparison:
    """This run against a reference on the same tokens."""

    reference_perplexity: float
    top1_agreement: float  # fraction of tokens whose most likely next token is the reference's
    mean_kl: float  # nats a token: KL(reference || this run) over the reference's top-k and the rest


def compare(run: TokenScores, reference_ids: np.ndarray, reference_logprobs: np.ndarray,
            reference_token_logprobs: np.ndarray) -> Comparison:
    """`run` (scored with `reference_ids`) against a reference's top-k ids and log-probabilities
    [N, K] and its log-probabilities of the text's tokens [N]."""
    assert run.at_reference is not None and run.at_reference.shape == reference_ids.shape
    p = np.exp(reference_logprobs)  # [N, K]
    q = np.exp(run.at_reference)
    p_rest = np.clip(1 - p.sum(1), TINY, None)
    q_rest = np.clip(1 - q.sum(1), TINY, None)
    kl = (p * (reference_logprobs - run.at_reference)).sum(1) + p_rest * (np.log(p_rest) - np.log(q_rest))
    return Comparison(float(np.exp(-reference_token_logprobs.mean())),
                      float((run.top_ids[:, 0] == reference_ids[:, 0]).mean()), float(kl.mean()))
