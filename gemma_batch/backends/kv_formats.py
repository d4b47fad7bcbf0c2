"""How a KV cache stores K and V (`--kv-dtype`), defined once for every backend.

* fp32: as computed. fp16: rounded to nearest (clamped into fp16's range). bf16: rounded to
  nearest even (the upper half of the fp32 bits).
* int8: per token, KV head and group of `kv_int8_group(hd)` values (32, or the whole head where
  hd is no multiple of 32), s = max |x| / 127 over the group (1 when it is all zeros),
  q = rint(x / s) in [-127, 127], stored with its scales as fp32; read back as q * s. One scale
  per whole head cost the real Gemma 3 270M +1.0% perplexity (hd 256; a few large values set the
  scale for every other); per 32, +0.14% (docs/EXPERIMENTS.md, "int8 KV grain").

The cache holds K after its norm and RoPE, V as projected, so these roundings are all that the
cache adds to a step's arithmetic.
"""

from __future__ import annotations

from collections.abc import Container

import numpy as np

from ..model.config import Gemma3Config

KV_DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}  # bytes per value
FP16_MAX = np.float32(65504.0)
INT8_GROUP = 32  # values per int8 scale (kv_int8_group)


def kv_int8_group(head_dim: int) -> int:
    """Values per int8 scale: 32, or the whole head where `head_dim` is no multiple of 32."""
    return INT8_GROUP if head_dim % INT8_GROUP == 0 else head_dim


def kv_label(kv_dtype: str, head_dim: int) -> str:
    """The KV format as a backend's identity names it: int8 with its group (`int8-g32`), so a job
    begun with another int8 layout (one scale per head, before 2026-11-28) does not resume with this."""
    return f"int8-g{kv_int8_group(head_dim)}" if kv_dtype == "int8" else kv_dtype


def kv_slot_bytes(kv_dtype: str, heads: int, head_dim: int) -> int:
    """Bytes one token slot of one layer's K (or V) takes: values, plus int8's scales."""
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"KV dtype {kv_dtype!r}: expected one of {', '.join(KV_DTYPES)}")
    scales = 4 * heads * (head_dim // kv_int8_group(head_dim)) if kv_dtype == "int8" else 0
    return heads * head_dim * KV_DTYPES[kv_dtype] + scales


def kv_token_bytes(cfg: Gemma3Config, group: str, kv_dtype: str, held: Container[int] | None = None) -> int:
    """Bytes one token slot of KV group `group` takes: K and V of each of its layers (of those in
    `held`, where a backend holds only some: a pipeline stage)."""
    layers = [i for g in cfg.kv_groups() if g.name == group for i in g.layers if held is None or i in held]
    return len(layers) * 2 * kv_slot_bytes(kv_dtype, cfg.num_kv_heads, cfg.head_dim)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), round to nearest even."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


class KVStore:
    """One layer's K (or V) pages in a KV dtype: `slots` token slots of [heads, hd]."""

    def __init__(self, kv_dtype: str, slots: int, heads: int, head_dim: int) -> None:
        storage = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16, "int8": np.int8}[kv_dtype]
        self.kv_dtype = kv_dtype
        self.data = np.zeros((slots, heads, head_dim), storage)
        self.group = kv_int8_group(head_dim)
        self.scales = np.ones((slots, heads, head_dim // self.group), np.float32) if kv_dtype == "int8" else None

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + (0 if self.scales is None else self.scales.nbytes)

    def write(self, slots: np.ndarray, x: np.ndarray) -> None:
        """Store x [T, heads, hd] (float32) at `slots` [T]."""
        if self.kv_dtype == "fp32":
            self.data[slots] = x
        elif self.kv_dtype == "fp16":
            self.data[slots] = np.clip(x, -FP16_MAX, FP16_MAX).astype(np.float16)
        elif self.kv_dtype == "bf16":
            self.data[slots] = bf16_round(x)
        else:
            t, heads, hd = x.shape
            groups = x.reshape(t, heads, hd // self.group, self.group)
            amax = np.abs(groups).max(axis=-1)
            scales = np.where(amax > 0, amax / np.float32(127.0), np.float32(1.0)).astype(np.float32)
            self.data[slots] = np.clip(np.rint(groups / scales[..., None]), -127, 127).astype(np.int8).reshape(x.shape)
            self.scales[slots] = scales

    def read(self, slots: np.ndarray) -> np.ndarray:
        """float32 [m, heads, hd] of the values at `slots` [m]."""
        if self.kv_dtype == "bf16":
            return (self.data[slots].astype(np.uint32) << np.uint32(16)).view(np.float32)
        values = self.data[slots].astype(np.float32, copy=False)  # fancy indexing copied already
        if self.scales is not None:
            m, heads, hd = values.shape
            values.reshape(m, heads, hd // self.group, self.group)[:] *= self.scales[slots][..., None]
        return values
