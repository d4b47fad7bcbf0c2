"""Continuous batching: which sequences run in the next step, and how many of their tokens.

Each step, in this order:

1. Running sequences that decode get their one token (oldest admission first).
2. Running sequences still in prefill get their next chunk, within the step's token budget.
3. Waiting sequences join while there is room: fewer than `max_batch` running, budget left,
   and blocks for their first chunk with one spare block per running sequence kept free
   (so that admitting does not immediately force a preemption). With prefix caching, a joining
   sequence starts from its cached prefix (`KVCacheManager.find_prefix`); one whose next prompt
   block a running sequence is computing waits (those behind it may join): a step later it
   takes that block instead of computing it too, so a shared instruction is computed once.

A chunk ends at the prompt's end (`Sequence.num_next_tokens`), and the sequences feeding prompt
tokens come last in the step: StepBatch's contract, which lets a backend run the prompt tokens'
products as one block of rows in their own summation order.

Small steps beside a full batch: where the backend names `small_step` (the most tokens a step can
hold at about a decode step's cost), a step in which at least half of `max_batch` sequences decode
takes at most that many tokens, so that a new prompt is fed a chunk at a time beside them instead
of all at once in a step several times as long (a 128-token prompt beside 31 decoding sequences
added 15 ms to one step on the H100, 7 ms to four: docs/EXPERIMENTS.md, "Steps recorded once per
run, prompts fed beside a full batch in small steps"). Only while the prompt tokens the batch could
take now (those of sequences in prefill, and of the waiting ones that would fill its free places)
fit in SMALL_STEP_ROUNDS such steps: a longer backlog, fed that slowly, would leave places idle.
Otherwise, and with fewer decoding, prompts go in steps of the whole budget.

When a scheduled sequence needs a block and none is free, the most recently admitted running
sequence is preempted: its blocks are freed, its cache forgotten, and it goes back to the front
of the queue to be recomputed (prompt and the tokens it had generated) when blocks free up
and the tokens it was still sampling in steps submitted ahead are in.
The oldest sequence is never preempted while another is running, and the KV plan guarantees it
fits alone, so every sequence finishes: no deadlock, no starvation.
"""

from __future__ import annotations

from collections import deque
from itertools import islice

from .kv_cache import KVCacheManager, PrefixHit
from .sequence import Sequence

SMALL_STEP_ROUNDS = 4  # small steps only for a prompt backlog they clear in this many (module doc)


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_batch: int, step_token_budget: int, small_step: int | None = None) -> None:
        if step_token_budget < max_batch:
            raise ValueError(f"step token budget {step_token_budget} < max batch {max_batch}: decodes would starve")
        self.kv = kv
        self.max_batch = max_batch
        self.step_token_budget = step_token_budget
        self.small_step = small_step  # see the module doc; None: every step may take the whole budget
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order
        self.preemptions = 0

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self, pinned: frozenset[int] | set[int] = frozenset()) -> list[tuple[Sequence, int]]:
        """The step's (sequence, number of tokens) pairs; their blocks are allocated. The sequences
        whose ids are `pinned` are not preempted (a sequence that needs blocks then waits)."""
        scheduled: dict[int, tuple[Sequence, int]] = {}
        decoding = [s for s in self.running if s.num_uncached_tokens == 1]
        prefilling = [s for s in self.running if s.num_uncached_tokens > 1]
        budget = self.step_token_budget
        if self.small_step is not None and 2 * len(decoding) >= self.max_batch:
            room = max(self.small_step - len(decoding), 0)
            joining = islice(self.waiting, max(self.max_batch - len(self.running), 0))
            backlog = sum(s.num_uncached_tokens for s in prefilling) + sum(s.num_uncached_tokens for s in joining)
            if backlog <= SMALL_STEP_ROUNDS * room:
                budget = min(budget, len(decoding) + room)
        preempted = False
        for seq in decoding + prefilling:
            if seq not in self.running:  # preempted earlier in this step
                continue
            n = min(seq.num_next_tokens, budget)
            if n == 0:
                break
            while not self.kv.can_allocate(seq, seq.num_cached_tokens + n):
                victim = next((s for s in reversed(self.running) if s.seq_id not in pinned), None)
                if victim is None:
                    break
                preempted = True
                if victim.seq_id in scheduled:
                    budget += scheduled.pop(victim.seq_id)[1]
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                self.kv.allocate(seq, seq.num_cached_tokens + n)
                scheduled[seq.seq_id] = (seq, n)
                budget -= n
        computing: set[bytes] | None = None  # prompt blocks the running sequences are computing
        for seq in list(self.waiting) if not preempted else []:
            if len(self.running) >= self.max_batch or budget <= 0:
                break
            if seq.num_pending:  # preempted with tokens still being sampled: recomputed once they are in
                break
            hit = self.kv.find_prefix(seq)
            computing = self.kv.computing(self.running) if computing is None else computing
            if self.kv.waits_for_sibling(seq, hit, computing):  # it takes the sibling's blocks a step later
                continue
            n = min(seq.num_next_tokens - hit.num_tokens, budget)
            if not self._fits_with_headroom(seq, n, hit):
                break
            self.waiting.remove(seq)
            self.running.append(seq)
            self.kv.take_prefix(seq, hit)
            self.kv.allocate(seq, seq.num_cached_tokens + n)
            computing |= self.kv.computing([seq])
            scheduled[seq.seq_id] = (seq, n)
            budget -= n
        return sorted(scheduled.values(), key=lambda pair: pair[0].feeds_prompt)  # (stable: prompts last)

    def finish(self, seq: Sequence) -> None:
        """A sequence ended: it leaves the batch (or the queue, if it was preempted while its last
        token was being sampled) and its blocks go back to the pools. Finishing it again does
        nothing (the engine releases a sequence when its last token is scheduled, and finishes it
        once that token is in)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq)

    def _fits_with_headroom(self, seq: Sequence, n: int, hit: PrefixHit) -> bool:
        needed = self.kv.blocks_needed(seq, hit.num_tokens + n, hit)
        spare = len(self.running)
        return all(self.kv.pools[name].num_free >= k + spare for name, k in needed.items())

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_cached_tokens = 0
        self.waiting.appendleft(seq)
        self.preemptions += 1
