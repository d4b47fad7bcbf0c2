"""Paged KV cache bookkeeping: block ids only, never memory (the backend owns the memory).

Each KV group the model declares (global layers, sliding-window layers) has its own pool of
blocks. A sequence's block table for a group maps position span j (positions
`[j*block_size, (j+1)*block_size)`) to a block id. Global groups keep every block until the
sequence ends; sliding groups release a block as soon as no future query can see it.

Prefix caching (where the manager has a `prefix_seed`): a sequence's full prompt blocks are
registered under their keys (`block_pool`) as it computes them, and stay cached, free or held,
until their memory is needed. A new sequence starts from the longest run of its prompt's blocks
that every group holds: in a global group every block of that run, in a sliding group only the
blocks a query just after the run can see (the last window of it). The hit stops one token
short of the prompt's end: the step that feeds the last prompt token gives the first logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model.config import KVGroup
from .block_pool import BlockPool, block_keys
from .sequence import Sequence


@dataclass(frozen=True)
class PrefixHit:
    """The cached blocks a new sequence can start from: its first `num_tokens` prompt tokens."""

    num_tokens: int = 0
    tables: dict[str, list[int]] = field(default_factory=dict)  # per group: its first table entries
    num_free: dict[str, int] = field(default_factory=dict)  # per group: hit blocks no one holds now


class KVCacheManager:
    """Grows, trims and frees the block tables of sequences, one pool per KV group."""

    def __init__(self, groups: tuple[KVGroup, ...], num_blocks: dict[str, int], block_size: int,
                 prefix_seed: bytes | None = None) -> None:
        """`prefix_seed`: prefix caching on, keys chained from it (`block_keys`); None: off."""
        self.groups = groups
        self.block_size = block_size
        self.pools = {g.name: BlockPool(num_blocks[g.name]) for g in groups}
        self.prefix_seed = prefix_seed

    def _keys(self, seq: Sequence) -> list[bytes]:
        """The keys of `seq`'s full prompt blocks (computed once)."""
        if seq.prefix_keys is None:
            n = seq.num_prompt_tokens // self.block_size
            seq.prefix_keys = block_keys(seq.token_ids, self.block_size, n, self.prefix_seed) if self.prefix_seed else []
        return seq.prefix_keys

    def find_prefix(self, seq: Sequence) -> PrefixHit:
        """The longest cached start of a sequence about to be admitted (none if it has a cache)."""
        if self.prefix_seed is None or seq.num_cached_tokens:
            return PrefixHit()
        keys = self._keys(seq)[: (seq.num_prompt_tokens - 1) // self.block_size]  # a prompt token left to feed
        m, settled = len(keys), False
        while not settled:  # (each group's condition checked again once another lowered m)
            settled = True
            for g in self.groups:
                pool = self.pools[g.name]
                first = self._first_needed_position(g, m * self.block_size) // self.block_size
                missing = [j for j in range(first, m) if pool.lookup(keys[j]) is None]
                if missing:  # the hit must stop before the first missing block a query after it would read
                    m, settled = (missing[0] if g.window is None else missing[-1]), False
        if not m:
            return PrefixHit()
        tables, num_free = {}, {}
        for g in self.groups:
            pool = self.pools[g.name]
            first = self._first_needed_position(g, m * self.block_size) // self.block_size
            tables[g.name] = [-1] * first + [pool.lookup(k) for k in keys[first:m]]
            num_free[g.name] = sum(pool.is_free(b) for b in tables[g.name] if b >= 0)
        return PrefixHit(m * self.block_size, tables, num_free)

    def take_prefix(self, seq: Sequence, hit: PrefixHit) -> None:
        """Start `seq` from `hit`: its blocks are held and its tokens count as cached."""
        seq.num_prompt_tokens_hit = hit.num_tokens
        if not hit.num_tokens:
            return
        for g in self.groups:
            table = seq.block_tables[g.name] = list(hit.tables[g.name])
            for block in table:
                if block >= 0:
                    self.pools[g.name].take(block)
        seq.num_cached_tokens = hit.num_tokens
        seq.num_registered_blocks = hit.num_tokens // self.block_size

    def register(self, seq: Sequence) -> None:
        """After a step is submitted: cache the prompt blocks `seq` has now filled (the device writes
        them before any later step reads them)."""
        if self.prefix_seed is None:
            return
        full = min(seq.num_cached_tokens, seq.num_prompt_tokens) // self.block_size
        if full <= seq.num_registered_blocks:
            return
        keys = self._keys(seq)
        for g in self.groups:
            table = seq.block_tables[g.name]
            for j in range(seq.num_registered_blocks, full):
                if table[j] >= 0:
                    self.pools[g.name].register(table[j], keys[j])
        seq.num_registered_blocks = full

    def computing(self, seqs: list[Sequence]) -> set[bytes]:
        """Keys of prompt blocks these (running) sequences will compute and register."""
        return {k for seq in seqs if self.prefix_seed is not None and seq.feeds_prompt
                for k in self._keys(seq)[seq.num_registered_blocks:]}

    def waits_for_sibling(self, seq: Sequence, hit: PrefixHit, computing: set[bytes]) -> bool:
        """Whether the block after `seq`'s hit is one a running sequence is computing: admitted a
        step later, it would take that block instead of computing it again."""
        j = hit.num_tokens // self.block_size
        return bool(computing) and j < (seq.num_prompt_tokens - 1) // self.block_size and self._keys(seq)[j] in computing

    def _first_needed_position(self, group: KVGroup, first_query: int) -> int:
        """Earliest position a query at `first_query` (or later) can attend to in this group."""
        return 0 if group.window is None else max(0, first_query - group.window + 1)

    def _missing(self, seq: Sequence, group: KVGroup, context_len: int, hit: PrefixHit | None = None) -> range:
        """Block-table entries the next step of `seq` (started from `hit`, if given) writes or
        reads, up to `context_len`, that it does not hold yet. It holds every entry from the first
        one a query can still see (released entries all lie before it) to the end of its table, so
        only entries past the table's end (and past that first one) are missing: O(1) per step."""
        cached = seq.num_cached_tokens if hit is None else hit.num_tokens
        table = seq.block_tables.get(group.name, ()) if hit is None else hit.tables.get(group.name, ())
        first = self._first_needed_position(group, cached) // self.block_size
        return range(max(first, len(table)), (context_len - 1) // self.block_size + 1)

    def blocks_needed(self, seq: Sequence, context_len: int, hit: PrefixHit | None = None) -> dict[str, int]:
        """Free blocks per group that `seq` (started from `hit`, if given) takes to hold positions up
        to `context_len - 1`: new ones, and cached ones of the hit that no one holds."""
        return {g.name: len(self._missing(seq, g, context_len, hit)) + (hit.num_free.get(g.name, 0) if hit else 0)
                for g in self.groups}

    def can_allocate(self, seq: Sequence, context_len: int) -> bool:
        needed = self.blocks_needed(seq, context_len)
        return all(self.pools[name].num_free >= n for name, n in needed.items())

    def allocate(self, seq: Sequence, context_len: int) -> None:
        """Give `seq` blocks for every position its next step writes or reads, up to `context_len`."""
        if not self.can_allocate(seq, context_len):
            raise RuntimeError(f"sequence {seq.seq_id}: not enough free KV blocks for {context_len} tokens")
        for g in self.groups:
            missing = self._missing(seq, g, context_len)
            table = seq.block_tables.setdefault(g.name, [])
            table.extend([-1] * (missing.start - len(table)))  # entries no query can see any more
            table.extend(self.pools[g.name].allocate() for _ in missing)

    def release_out_of_window(self, seq: Sequence, first_query: int | None = None) -> None:
        """After a step: free sliding-window blocks that no query at or after the cache end (or
        `first_query`, where the sequence will go back to) can see."""
        first_query = seq.num_cached_tokens if first_query is None else min(first_query, seq.num_cached_tokens)
        for g in self.groups:
            if g.window is None:
                continue
            table = seq.block_tables.get(g.name, [])
            first_needed = self._first_needed_position(g, first_query)
            # Newest first: the entries before the first one already released were released too.
            for j in reversed(range(min(len(table), first_needed // self.block_size))):
                if table[j] < 0:
                    break
                self.pools[g.name].release(table[j])
                table[j] = -1

    def free(self, seq: Sequence) -> None:
        """Return every block of a finished (or preempted) sequence."""
        for name, table in seq.block_tables.items():
            for block in table:
                if block >= 0:
                    self.pools[name].release(block)
        seq.block_tables = {}
        seq.num_registered_blocks = 0
