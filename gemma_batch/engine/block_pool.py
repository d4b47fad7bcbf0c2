"""One KV group's block ids: which are free, how many sequences hold each, and which hold a
cached prefix block that a later sequence may take instead of computing it.

A block's key names the tokens whose K/V it holds: a hash chained over its tokens and its
parent block's key (`block_keys`), so equal keys mean equal prefixes, and equal K/V (the
backends are batch-invariant: a token's K/V does not depend on how its prompt was chunked or
what ran beside it). A block gets a key once its span is all prompt tokens computed (a
completion token's K/V may be summed in another order than a prompt token's: StepBatch).

Free blocks wait in least-recently-freed order. Taking a free block for new tokens takes the
first: blocks without a key come first (nothing is lost), then cached blocks, the one freed
longest ago first; its key is forgotten then. A block some sequence holds is never handed out.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence as Seq

import numpy as np


def block_keys(token_ids: Seq[int], block_size: int, num_blocks: int, seed: bytes) -> list[bytes]:
    """The keys of the first `num_blocks` full blocks of `token_ids`, chained from `seed` (which
    names what else decides the K/V: the model, the backend's arithmetic, the KV dtype)."""
    keys, parent = [], seed
    tokens = np.asarray(token_ids[: num_blocks * block_size], dtype=np.int64)
    for j in range(num_blocks):
        parent = hashlib.blake2b(parent + tokens[j * block_size: (j + 1) * block_size].tobytes(), digest_size=16).digest()
        keys.append(parent)
    return keys


class BlockPool:
    """The block ids of one KV group: reference counts, the free ones in eviction order, and the
    keys of cached blocks (module doc)."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._refs = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # first out first
        self._key_of: dict[int, bytes] = {}
        self._by_key: dict[bytes, int] = {}
        self.evictions = 0  # cached blocks given up for new tokens

    @property
    def num_free(self) -> int:
        """Blocks no sequence holds (cached ones included: they are given up when needed)."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Blocks holding a cached prefix block, held or free."""
        return len(self._key_of)

    def allocate(self) -> int:
        """A free block for new tokens (a cached one forgets its key)."""
        if not self._free:
            raise RuntimeError("no free KV block")
        block, _ = self._free.popitem(last=False)
        if (key := self._key_of.pop(block, None)) is not None:
            del self._by_key[key]
            self.evictions += 1
        self._refs[block] = 1
        return block

    def release(self, block: int) -> None:
        """One holder lets go; with none left the block is free (last out, if cached)."""
        self._refs[block] -= 1
        if self._refs[block] == 0:
            self._free[block] = None
            if block not in self._key_of:
                self._free.move_to_end(block, last=False)  # nothing cached: handed out first

    def lookup(self, key: bytes) -> int | None:
        """The block cached under `key`, if any."""
        return self._by_key.get(key)

    def is_free(self, block: int) -> bool:
        return self._refs[block] == 0

    def take(self, block: int) -> None:
        """Hold a cached block (a prefix hit)."""
        if self._refs[block] == 0:
            del self._free[block]
        self._refs[block] += 1

    def register(self, block: int, key: bytes) -> None:
        """`block` (held) now holds the prefix block `key`; if another block already does, it
        stays the cached one."""
        if key not in self._by_key and block not in self._key_of:
            self._by_key[key] = block
            self._key_of[block] = key
