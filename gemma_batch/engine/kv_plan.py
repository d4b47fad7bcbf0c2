"""Sizing the paged KV cache: how many blocks each KV group gets from a memory budget.

A sequence of L tokens needs ceil(L / block_size) blocks of every global group, but at most
`window_blocks` of a sliding group: the window plus the largest prefill chunk, as blocks are
released once they leave the window. The plan first reserves sliding blocks for `max_batch`
sequences, then gives the rest to the global groups (where long contexts live), never more
than `max_batch` full-length sequences could use. It guarantees that one sequence of
`max_model_len` tokens fits on its own, which is what lets the scheduler always make progress;
when the budget cannot hold one, `max_model_len` is lowered to what fits and a notice says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..model.config import KVGroup


class KVBudgetError(ValueError):
    """The KV budget cannot hold even a short sequence."""


@dataclass(frozen=True)
class KVPlan:
    block_size: int
    num_blocks: dict[str, int]  # per KV group
    max_model_len: int  # prompt + completion bound, possibly lowered to fit the budget
    budget_bytes: int
    used_bytes: int
    full_length_seqs: int  # sequences of max_model_len that fit at once (of `sized_for` tokens, where set)
    notice: str | None = None  # set when max_model_len was lowered
    sized_for: int | None = None  # the most tokens of the job's rows, where the plan was cut to them (`fit_to_rows`)
    counted: bool = False  # `sized_for` counted from the rows' tokens, not bounded by their bytes

    def describe(self, groups: tuple[KVGroup, ...]) -> str:
        """One line for the job's start: what fits in the cache."""
        parts = [f"{self.num_blocks[g.name]} {g.name} blocks" for g in groups]
        tokens = min(self.num_blocks[g.name] * self.block_size for g in groups if g.window is None) if any(
            g.window is None for g in groups) else None
        held = f"holds {tokens} tokens of context, " if tokens is not None else ""
        head = f"KV cache: {self.used_bytes / 2**20:.1f} MiB in {', '.join(parts)} of {self.block_size} tokens; {held}"
        if self.sized_for is not None:
            return (f"{head}sized for this job: {self.full_length_seqs} row(s) at once of up to {self.sized_for} tokens "
                    f"({'counted' if self.counted else 'bounded by their bytes'})")
        return (f"{head}fits {self.full_length_seqs} sequence(s) of {self.max_model_len} tokens at once "
                "(shorter sequences share it, up to --max-batch)")


def blocks_per_sequence(group: KVGroup, length: int, block_size: int, max_chunk: int) -> int:
    """Most blocks of `group` a sequence of `length` tokens holds at once."""
    full = -(-length // block_size)
    if group.window is None:
        return full
    return min(full, -(-(group.window - 1 + max_chunk) // block_size) + 1)


def plan_kv(
    groups: tuple[KVGroup, ...],
    bytes_per_token: Mapping[str, int],
    budget_bytes: int,
    block_size: int,
    max_model_len: int,
    max_batch: int,
    max_chunk: int,
    max_blocks: Mapping[str, int | None] | None = None,
) -> KVPlan:
    """Blocks per group for `budget_bytes`, at most `max_blocks[group]` (a device's largest buffer);
    lowers `max_model_len` if one sequence does not fit."""
    block_bytes = {g.name: bytes_per_token[g.name] * block_size for g in groups}
    limit = {g.name: (max_blocks or {}).get(g.name) for g in groups}

    def seq_bytes(length: int) -> int:
        return sum(blocks_per_sequence(g, length, block_size, max_chunk) * block_bytes[g.name] for g in groups)

    def fits(length: int) -> bool:
        return seq_bytes(length) <= budget_bytes and all(
            limit[g.name] is None or blocks_per_sequence(g, length, block_size, max_chunk) <= limit[g.name] for g in groups)

    requested, notice = max_model_len, None
    if not fits(max_model_len):
        lo, hi = 0, max_model_len  # largest length that fits: lo fits (or is 0), hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        if lo < block_size:
            raise KVBudgetError(
                f"the KV budget of {budget_bytes / 2**20:.1f} MiB cannot hold one sequence of {block_size} tokens "
                f"({seq_bytes(block_size) / 2**20:.2f} MiB); raise --kv-memory"
            )
        max_model_len = lo
        notice = (
            f"max model length lowered from {requested} to {max_model_len} tokens: the KV budget of "
            f"{budget_bytes / 2**20:.1f} MiB (and the device's largest buffer) holds one sequence of at most that "
            f"length; raise --kv-memory "
            f"(or lower --max-model-len) to change it"
        )

    per_seq = {g.name: blocks_per_sequence(g, max_model_len, block_size, max_chunk) for g in groups}
    sliding = [g for g in groups if g.window is not None]
    global_ = [g for g in groups if g.window is None]
    global_seq_bytes = sum(per_seq[g.name] * block_bytes[g.name] for g in global_)
    sliding_seq_bytes = sum(per_seq[g.name] * block_bytes[g.name] for g in sliding)
    # Sliding blocks for as many of max_batch sequences as leave room for one full-length global set.
    sliding_seqs = max_batch if not sliding_seq_bytes else min(
        max_batch, (budget_bytes - global_seq_bytes) // sliding_seq_bytes
    )
    left = budget_bytes - sliding_seqs * sliding_seq_bytes
    global_seqs = max_batch if not global_seq_bytes else min(max_batch, left / global_seq_bytes)
    num_blocks = {g.name: sliding_seqs * per_seq[g.name] for g in sliding}
    num_blocks |= {g.name: int(global_seqs * per_seq[g.name]) for g in global_}
    num_blocks = {name: n if limit[name] is None else min(n, limit[name]) for name, n in num_blocks.items()}
    used = sum(n * block_bytes[name] for name, n in num_blocks.items())
    full_length_seqs = min(
        (num_blocks[g.name] // per_seq[g.name] for g in groups if per_seq[g.name]), default=max_batch
    )
    return KVPlan(block_size, num_blocks, max_model_len, budget_bytes, used, full_length_seqs, notice)


def fit_to_rows(plan: KVPlan, groups: tuple[KVGroup, ...], bytes_per_token: Mapping[str, int], rows: int, tokens: int,
                max_batch: int, max_chunk: int, counted: bool = False) -> KVPlan:
    """`plan` cut to what a job of `rows` rows of at most `tokens` tokens each holds at once:
    min(rows, max_batch) of them (never more blocks than `plan` has, never fewer than one such
    row needs). `max_model_len` stays `plan`'s: it bounds the rows, the cache only their sum.
    `counted`: `tokens` is the rows' count (said by `describe`)."""
    length, seqs = min(max(tokens, 1), plan.max_model_len), max(1, min(rows, max_batch))
    per_seq = {g.name: blocks_per_sequence(g, length, plan.block_size, max_chunk) for g in groups}
    num_blocks = {g.name: min(plan.num_blocks[g.name], max(per_seq[g.name], seqs * per_seq[g.name])) for g in groups}
    used = sum(n * bytes_per_token[name] * plan.block_size for name, n in num_blocks.items())
    fits = min((num_blocks[g.name] // per_seq[g.name] for g in groups if per_seq[g.name]), default=seqs)
    return KVPlan(plan.block_size, num_blocks, plan.max_model_len, plan.budget_bytes, used, fits, plan.notice, length,
                  counted)
