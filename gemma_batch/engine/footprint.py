"""Memory planning for `gemma-batch inspect`: what a model takes in a weight format and KV dtype,
and how many sequences of a given length fit in a memory budget.

Sizes are a GPU backend's (weights as the format stores them: the CPU backend holds bf16 and
fp16 matrices widened to float32). A sequence's KV is what the engine's planner reserves for it
(`kv_plan.blocks_per_sequence`): every token in the global layers, and in the sliding-window
layers the window plus one prefill chunk, in whole blocks. A cached prefix (prefix caching,
`kv_cache`) keeps every block of it in the global layers and the blocks of its last window in
the sliding-window layers: what a prompt that starts with it reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..backends.kv_formats import kv_token_bytes
from ..backends.placement import Placement, part_of
from ..model.config import Gemma3Config
from ..model.quant import WeightFormat
from ..model.conversion import converted_nbytes_by_dtype
from .kv_plan import blocks_per_sequence


@dataclass(frozen=True)
class Footprint:
    cfg: Gemma3Config
    weights: WeightFormat
    kv_dtype: str
    weight_bytes: dict[str, int]  # by storage kind (`converted_nbytes_by_dtype`)
    kv_bytes_per_token: dict[str, int]  # per KV group, K and V of all its layers

    @property
    def total_weight_bytes(self) -> int:
        return sum(self.weight_bytes.values())

    def sequence_bytes(self, length: int, block_size: int = 16, max_chunk: int = 512) -> int:
        """KV bytes the planner reserves for one sequence of `length` tokens."""
        return sum(
            blocks_per_sequence(g, length, block_size, max_chunk) * block_size * self.kv_bytes_per_token[g.name]
            for g in self.cfg.kv_groups()
        )

    def sequences_that_fit(self, memory: int, length: int, block_size: int = 16, max_chunk: int = 512) -> int:
        """How many sequences of `length` tokens fit next to the weights in `memory` bytes."""
        free = memory - self.total_weight_bytes
        return max(0, free // self.sequence_bytes(length, block_size, max_chunk))


    def prefix_bytes(self, length: int, block_size: int = 16) -> int:
        """KV bytes a cached prefix of `length` tokens keeps (module doc): a sequence's, with no
        prefill chunk beside the sliding window."""
        return self.sequence_bytes(length, block_size, max_chunk=0)

    def prefix_room(self, memory: int, batch: int, length: int, block_size: int = 16, max_chunk: int = 512) -> tuple[int, int]:
        """Beside the weights and `batch` sequences of `length` tokens in `memory`: how many cached
        prefix blocks fit (K/V of every layer), and how many cached prefixes of `length` tokens."""
        free = max(0, memory - self.total_weight_bytes - batch * self.sequence_bytes(length, block_size, max_chunk))
        return free // (block_size * sum(self.kv_bytes_per_token.values())), free // self.prefix_bytes(length, block_size)


def footprint(cfg: Gemma3Config, layout: Mapping[str, tuple[str, tuple[int, ...]]], weights: WeightFormat,
              kv_dtype: str) -> Footprint:
    """The footprint of a model whose tensors have `layout` (name -> stored dtype and shape)."""
    per_token = {g.name: kv_token_bytes(cfg, g.name, kv_dtype) for g in cfg.kv_groups()}
    return Footprint(cfg, weights, kv_dtype, converted_nbytes_by_dtype(layout, weights), per_token)


def placed_bytes(fp: Footprint, placement: Placement, layout: Mapping[str, tuple[str, tuple[int, ...]]], length: int,
                 block_size: int = 16, max_chunk: int = 512) -> dict[str, tuple[int, int]]:
    """Per device of `placement`: bytes of weights it holds, and of KV it reserves for one sequence
    of `length` tokens. A layer's KV sits where its attention runs; the tied embedding is held by
    the embed device and, as the LM head, by the head device."""
    return _placed(fp, placement, _part_bytes(fp, layout), length, block_size, max_chunk)


def _part_bytes(fp: Footprint, layout: Mapping[str, tuple[str, tuple[int, ...]]]) -> list[tuple[str, int | None, int]]:
    """(part, layer, bytes in the footprint's weight format) of each tensor (`placement.part_of`)."""
    return [(*part_of(name), sum(converted_nbytes_by_dtype({name: layout[name]}, fp.weights).values())) for name in layout]


def _placed(fp: Footprint, placement: Placement, parts: list[tuple[str, int | None, int]], length: int,
            block_size: int, max_chunk: int) -> dict[str, tuple[int, int]]:
    weights = dict.fromkeys(placement.devices, 0)
    kv = dict.fromkeys(placement.devices, 0)
    for kind, layer, nbytes in parts:
        if kind == "embed":
            for device in {placement.embed, placement.head}:  # (the LM head is the embedding, transposed)
                weights[device] += nbytes
        else:
            weights[placement.head if kind == "head" else getattr(placement, kind)[layer]] += nbytes
    for g in fp.cfg.kv_groups():
        blocks = blocks_per_sequence(g, length, block_size, max_chunk)
        for layer in g.layers:
            kv[placement.attention[layer]] += blocks * block_size * fp.kv_bytes_per_token[g.name] // len(g.layers)
    return {d: (weights[d], kv[d]) for d in placement.devices}


def auto_placement(fp: Footprint, layout: Mapping[str, tuple[str, tuple[int, ...]]], budgets: list[tuple[str, int]],
                   length: int, batch: int, block_size: int = 16, max_chunk: int = 512) -> Placement:
    """`--place auto`: the devices of `budgets` (fastest first) each take, in turn, as many of the
    next layers as fit in its budget with `batch` sequences of `length` tokens (the embedding
    with the first layer, the LM head with the last); the CPU takes the rest."""
    layers, parts = fp.cfg.num_layers, _part_bytes(fp, layout)
    owners: list[str] = []

    def plan(devices: list[str]) -> Placement:
        return Placement(tuple(devices), tuple(devices), devices[0], devices[-1])

    for device, budget in budgets:
        start = taken = len(owners)
        for k in range(start + 1, layers + 1):
            weights, kv = _placed(fp, plan(owners + [device] * (k - start) + ["cpu"] * (layers - k)), parts,
                                  length, block_size, max_chunk)[device]
            if weights + batch * kv > budget:
                break
            taken = k
        owners += [device] * (taken - start)
    return plan(owners + ["cpu"] * (layers - len(owners)))
