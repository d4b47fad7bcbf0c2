"""The model's weights in device memory, uploaded once, in the checkpoint's own dtype.

Matrices stay bf16 / fp16 / fp32 as stored (bf16 and fp16 are widened exactly in the shaders);
norm weights are stored fp32. Layout changes happen here, at upload, from the checkpoint's
tensors: q, k and v of a layer go into one [(nh + 2 nkv) * hd, H] matrix so that the projection
is one dispatch; q_norm and k_norm share one [2 * hd] buffer.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ...model.checkpoint import Tensor, to_float32
from ...model.config import Gemma3Config
from ...model.weights import tensor_shapes
from .memory import Buffer, Memory

_QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
_QK_NORM = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")
_MATRICES = ("self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "pre_feedforward_layernorm.weight",
          "post_feedforward_layernorm.weight")
_ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4}


class DeviceWeights:
    """Per layer: `qkv`, `o_proj`, `gate_proj`, `up_proj`, `down_proj` (matrices), `qk_norm` and
    the four block norms (fp32); globally `embed`, `lm_head` (the embedding when tied), `norm`.
    `dtypes` gives each matrix's storage dtype ("BF16" | "F16" | "F32")."""

    def __init__(self, cfg: Gemma3Config, memory: Memory) -> None:
        self.cfg = cfg
        self.mem = memory
        self.layers: list[dict[str, Buffer]] = [{} for _ in range(cfg.num_layers)]
        self.globals: dict[str, Buffer] = {}
        self.dtypes: dict[tuple[int, str], str] = {}  # (layer or -1, key) -> dtype

    def buffer(self, layer: int, key: str) -> Buffer:
        return self.globals[key] if layer < 0 else self.layers[layer][key]

    def dtype(self, layer: int, key: str) -> str:
        return self.dtypes[(layer, key)]

    def load(self, tensors: Iterable[tuple[str, Tensor]]) -> None:
        cfg = self.cfg
        expected = tensor_shapes(cfg)
        seen: set[str] = set()
        for name, tensor in tensors:
            seen.add(name)
            if name in ("embed_tokens.weight", "lm_head.weight"):
                key = "embed" if name == "embed_tokens.weight" else "lm_head"
                self.globals[key] = self._matrix(-1, key, tensor, name)
            elif name == "norm.weight":
                self.globals["norm"] = self._fp32(to_float32(tensor), name)
            else:
                _, index, suffix = name.split(".", 2)
                self._layer_tensor(int(index), suffix, tensor, name)
        missing = sorted(set(expected) - seen)
        if missing:
            raise ValueError(f"backend received no tensor for {', '.join(missing[:5])} ({len(missing)} missing)")
        if "lm_head" not in self.globals:
            self.globals["lm_head"] = self.globals["embed"]
            self.dtypes[(-1, "lm_head")] = self.dtypes[(-1, "embed")]

    def _layer_tensor(self, layer: int, suffix: str, tensor: Tensor, name: str) -> None:
        cfg, slots = self.cfg, self.layers[layer]
        if suffix in _QKV:
            if (layer, "qkv") not in self.dtypes:
                rows = cfg.q_width + 2 * cfg.kv_width
                slots["qkv"] = self.mem.alloc(rows * cfg.hidden_size * _ITEMSIZE[tensor.dtype], f"{name} (fused qkv)")
                self.dtypes[(layer, "qkv")] = tensor.dtype
            elif self.dtypes[(layer, "qkv")] != tensor.dtype:
                raise ValueError(f"{name} is {tensor.dtype} but the layer's other q/k/v weights are "
                                 f"{self.dtypes[(layer, 'qkv')]}; the fused projection needs one dtype")
            first_row = (0, cfg.q_width, cfg.q_width + cfg.kv_width)[_QKV.index(suffix)]
            self.mem.upload(slots["qkv"], tensor.data, first_row * cfg.hidden_size * _ITEMSIZE[tensor.dtype])
        elif suffix in _QK_NORM:
            if "qk_norm" not in slots:
                slots["qk_norm"] = self.mem.alloc(2 * cfg.head_dim * 4, f"layer {layer} q/k norms")
            self.mem.upload(slots["qk_norm"], to_float32(tensor), _QK_NORM.index(suffix) * cfg.head_dim * 4)
        elif suffix in _MATRICES:
            key = suffix.split(".")[1]
            slots[key] = self._matrix(layer, key, tensor, name)
        elif suffix in _NORMS:
            slots[suffix.split(".")[0]] = self._fp32(to_float32(tensor), name)
        else:
            raise ValueError(f"unexpected tensor {name}")

    def _matrix(self, layer: int, key: str, tensor: Tensor, name: str) -> Buffer:
        if tensor.dtype not in _ITEMSIZE:
            raise ValueError(f"{name}: dtype {tensor.dtype} is not supported by the Vulkan backend (BF16, F16, F32)")
        buf = self.mem.alloc(tensor.data.nbytes, name)
        self.mem.upload(buf, tensor.data)
        self.dtypes[(layer, key)] = tensor.dtype
        return buf

    def _fp32(self, values: np.ndarray, name: str) -> Buffer:
        buf = self.mem.alloc(values.nbytes, name)
        self.mem.upload(buf, values.astype(np.float32))
        return buf

    @property
    def nbytes(self) -> int:
        seen = {id(b): b.size for layer in self.layers for b in layer.values()}
        seen |= {id(b): b.size for b in self.globals.values()}
        return sum(seen.values())
