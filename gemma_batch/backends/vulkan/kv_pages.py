"""The KV cache on the device: one K and one V page buffer per layer, each holding its KV group's
blocks (`shaders/kv_pages.glsl` lays out a slot), bounded by the device's largest buffer."""

from __future__ import annotations

from collections.abc import Container, Mapping

from ...model.config import Gemma3Config
from ..kv_formats import kv_slot_bytes
from .memory import Buffer, Memory


def max_page_blocks(cfg: Gemma3Config, kv_dtype: str, block_size: int, max_buffer: int) -> int:
    """The most blocks one layer's K (or V) page buffer holds within `max_buffer` bytes."""
    return max_buffer // (block_size * kv_slot_bytes(kv_dtype, cfg.num_kv_heads, cfg.head_dim))


def page_sizes(cfg: Gemma3Config, kv_dtype: str, num_blocks: Mapping[str, int], block_size: int,
               held: Container[int]) -> dict[int, int]:
    """Bytes of the K (and V) page buffer of each layer in `held` (a pipeline stage's: its own)
    for `num_blocks` of its group (at least one)."""
    slot_bytes = kv_slot_bytes(kv_dtype, cfg.num_kv_heads, cfg.head_dim)
    return {layer: max(1, num_blocks[group.name]) * block_size * slot_bytes
            for group in cfg.kv_groups() for layer in group.layers if layer in held}


def allocate_pages(mem: Memory, cfg: Gemma3Config, sizes: Mapping[int, int]) -> tuple[dict[int, Buffer], dict[int, Buffer]]:
    """The K and the V page buffers of every layer of `sizes`, by layer."""
    k_pages, v_pages = {}, {}
    for group in cfg.kv_groups():
        for layer in filter(sizes.__contains__, group.layers):
            k_pages[layer] = mem.alloc(sizes[layer], f"layer {layer} K pages ({group.name})")
            v_pages[layer] = mem.alloc(sizes[layer], f"layer {layer} V pages ({group.name})")
    return k_pages, v_pages
