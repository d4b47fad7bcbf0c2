"""Paged KV cache bookkeeping: block ids only, never memory (the backend owns the memory).

Each KV group the model declares (global layers, sliding-window layers) has its own pool of
blocks. A sequence's block table for a group maps position span j (positions
`[j*block_size, (j+1)*block_size)`) to a block id. Global groups keep every block until the
sequence ends; sliding groups release a block as soon as no future query can see it.
"""

from __future__ import annotations

from collections import deque

from ..model.config import KVGroup
from .sequence import Sequence


class BlockPool:
    """The free list of one KV group's block ids."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("no free KV block")
        return self._free.popleft()

    def release(self, block_id: int) -> None:
        self._free.append(block_id)


class KVCacheManager:
    """Grows, trims and frees the block tables of sequences, one pool per KV group."""

    def __init__(self, groups: tuple[KVGroup, ...], num_blocks: dict[str, int], block_size: int) -> None:
        self.groups = groups
        self.block_size = block_size
        self.pools = {g.name: BlockPool(num_blocks[g.name]) for g in groups}

    def _first_needed_position(self, group: KVGroup, first_query: int) -> int:
        """Earliest position a query at `first_query` (or later) can attend to in this group."""
        return 0 if group.window is None else max(0, first_query - group.window + 1)

    def _missing(self, seq: Sequence, group: KVGroup, context_len: int) -> range:
        """Block-table entries the next step of `seq` writes or reads, up to `context_len`, that
        it does not hold yet. It holds every entry from the first one a query can still see
        (released entries all lie before it) to the end of its table, so only entries past the
        table's end (and past that first one) are missing: O(1) per step, not O(context)."""
        first = self._first_needed_position(group, seq.num_cached_tokens) // self.block_size
        held = len(seq.block_tables.get(group.name, ()))
        return range(max(first, held), (context_len - 1) // self.block_size + 1)

    def blocks_needed(self, seq: Sequence, context_len: int) -> dict[str, int]:
        """New blocks per group for `seq` to hold positions up to `context_len - 1`."""
        return {g.name: len(self._missing(seq, g, context_len)) for g in self.groups}

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
