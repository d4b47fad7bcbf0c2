"""A GGUF's quantized matrices carried into gemma-batch's own layouts (model/quant.py), so a GGUF
runs in its own quantization: no second rounding where a layout holds the blocks exactly, and
about the file's size in memory.

    fmt = carried_format("Q4_K", "self_attn.o_proj.weight")   # int4-g32+min
    tensor = carry(raw_rows, "Q4_K", fmt)                      # a QuantizedTensor of those rows

| GGUF type | carried as | exact? |
|---|---|---|
| Q8_0, Q5_0 (a scale per 32, codes of 8 or 5 bits) | int8-g32, the block's scale | yes |
| Q4_0, Q4_1 (a scale, and a minimum, per 32) | int4-g32+min (Q4_0: minimum -8 scale) | yes |
| Q4_K (a scale and minimum per 32 under a super-block's two fp16 factors) | int4-g32+min | the products d x sc and dmin x m rounded to fp16 (2^-11 relative) |
| any other quantized type (Q6_K, Q5_1, Q5_K, Q2_K, Q3_K, IQ*) | int8-g32 of its values | to 1/254 of each 32's range |

The embedding table (the tied LM head: embed.comp reads int8 only) is always int8. The codes come
from the GGUF's own values (`gguf.quants.dequantize`, as transformers reads them) divided by the
block's scale: whole numbers wherever the scale is the block's, so the codes are the block's.
"""

from __future__ import annotations

import numpy as np

from .quant import QuantizedTensor, WeightFormat, quantize

INT8 = WeightFormat.parse("int8")
INT4 = WeightFormat("int4", 32)  # fp16 (scale, minimum) pairs
_EXACT_INT8 = {"Q8_0": 34, "Q5_0": 22}  # type -> block bytes (an fp16 scale first, per 32 weights)
_INT4 = {"Q4_0": 18, "Q4_1": 20, "Q4_K": 144}  # per 32 weights (Q4_0, Q4_1) or per 256 (Q4_K)
EMBEDDINGS = ("embed_tokens.weight", "lm_head.weight")
CARRIED = {str(INT8): INT8, str(INT4): INT4}  # the carried formats by name (`GGUFTensor.stored`)


def carried_format(type_name: str, name: str) -> WeightFormat:
    """The layout a quantized GGUF matrix (canonical `name`) of GGML type `type_name` is carried in."""
    return INT4 if type_name in _INT4 and name not in EMBEDDINGS else INT8


def carry(raw: np.ndarray, type_name: str, fmt: WeightFormat) -> QuantizedTensor:
    """Rows of a GGUF matrix (`raw`: their bytes, [rows, blocks' bytes]) of type `type_name` in
    `fmt` (int8 or int4 in groups of 32, `carried_format`'s choice or int8 for any type)."""
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    values = gguf.quants.dequantize(raw, qtype).astype(np.float32, copy=False)  # [rows, K]
    rows, k = values.shape
    groups = values.reshape(rows, k // 32, 32)
    if fmt == INT8 and type_name in _EXACT_INT8:
        scale = raw.reshape(rows, k // 32, _EXACT_INT8[type_name])[..., :2].copy().view(np.float16)[..., 0]
        s32 = scale.astype(np.float32)
        codes = np.rint(groups / np.where(s32 != 0, s32, 1)[..., None])
        return QuantizedTensor(INT8, codes.astype(np.int8).reshape(rows, k), scale)
    if fmt == INT4 and type_name in _INT4:
        scale, low = _int4_grid(raw, type_name, rows, k)
        codes = np.clip(np.rint((groups - low[..., None]) / np.where(scale != 0, scale, 1)[..., None]), 0, 15)
        q = codes.astype(np.uint8).reshape(rows, k)
        pairs = np.stack([scale, low], axis=-1).astype(np.float16)
        return QuantizedTensor(INT4, q[:, 0::2] | (q[:, 1::2] << 4), pairs)
    return quantize(values, fmt)


def _int4_grid(raw: np.ndarray, type_name: str, rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each 32 weights' scale and minimum, float32 [rows, K / 32], as the GGUF computes them."""
    import gguf

    if type_name == "Q4_K":
        blocks = raw.reshape(rows * (k // 256), 144)
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # [blocks, 1]
        dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        sc, m = gguf.quants.Q4_K.get_scale_min(blocks[:, 4:16].copy())  # [blocks, 8] each
        return (d * sc.astype(np.float32)).reshape(rows, k // 32), (-(dmin * m.astype(np.float32))).reshape(rows, k // 32)
    blocks = raw.reshape(rows, k // 32, _INT4[type_name])
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if type_name == "Q4_0":
        return d, np.float32(-8.0) * d
    return d, blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
