"""A Gemma 3 GGUF file (llama.cpp's format), read with `gguf`, ggml's own reader: its
hyper-parameters as a Hugging Face `config.json`, and its tensors under the Hugging Face names:
float ones as stored, quantized matrices carried into gemma-batch's int8 / int4 layouts
(`carried`, gguf_blocks.py), or dequantized exactly as transformers' GGUF loading does (`values`:
`gguf.quants.dequantize`, float32).

llama.cpp's converter (`convert_hf_to_gguf.py`, `Gemma3Model`) changes three things this undoes:
every RMSNorm weight is stored as (w + 1) (Gemma's norm multiplies by 1 + w), the embedding is
cut to the tokenizer's size, and Q and K are not permuted for Gemma (nothing to undo there). It
also leaves out what `llama-model.cpp` hard-codes for `gemma3`: the sliding-window pattern (6:
every sixth layer global), the local RoPE base (10,000, unscaled), and the attention scale
(1 / sqrt(head_dim), but 1 / sqrt(hidden / heads) for the 62-layer 27B). Global RoPE base and
linear scaling, the window, norms' epsilon and a final soft-cap come from the metadata.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .gguf_blocks import CARRIED, INT8, carried_format, carry
from .quant import QuantizedTensor

ARCH = "gemma3"
NORM_SHIFT = 1.0  # llama.cpp stores Gemma's RMSNorm weights as w + 1
SLIDING_PATTERN = 6  # llama.cpp's gemma3: layers 6, 12, ... (1-based) attend globally
LOCAL_ROPE_THETA = 10_000.0
LAYERS_27B = 62  # llama.cpp's LLM_TYPE_27B for gemma3, whose attention scale is 1 / sqrt(hidden / heads)
ROWS_AT_ONCE = 4096  # rows dequantized at a time (a 27B embedding is 5.6 GB as float32)
_LAYER = re.compile(r"blk\.(\d+)\.(.+)")
_LAYER_NAMES = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
_KEPT_TYPES = {"F32": "F32", "F16": "F16", "BF16": "BF16"}  # stored as they are; the rest carried (gguf_blocks.py)
_FUSED = re.compile(r"model\.layers\.(\d+)\.(?:self_attn|mlp)\.(q|k|v|gate|up)_proj\.weight")


class GGUFError(ValueError):
    """The file is not a Gemma 3 text GGUF gemma-batch can read; the message names it and says why."""


def hf_name(name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor (`blk.3.attn_q.weight` ->
    `model.layers.3.self_attn.q_proj.weight`), or None for a name Gemma 3 has no use for."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    match = _LAYER.fullmatch(name)
    if match and match.group(2) in _LAYER_NAMES:
        return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}"
    return None


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the file: its GGUF and Hugging Face names, type and [rows, columns] shape."""

    name: str
    hf_name: str
    type_name: str  # GGML's name: Q8_0, Q4_K, F32, ...
    shape: tuple[int, ...]  # numpy order: [out, in] for a matrix
    stored: str  # how it is written: F32, F16 or BF16, or a quantized matrix's carried format (gguf_blocks.py)


class GGUFModel:
    """An opened Gemma 3 GGUF file (memory-mapped). GGUFError where it is another architecture, a
    vision projector, truncated, or holds a tensor type or name it cannot take."""

    def __init__(self, path: Path) -> None:
        import gguf  # (the `gguf` package, imported where a GGUF is opened)

        self.path = Path(path)
        try:
            self._reader = gguf.GGUFReader(self.path)
        except (ValueError, IndexError, OSError, KeyError) as e:
            raise GGUFError(f"{self.path} cannot be read as GGUF: it looks truncated or is not a GGUF file ({e})") from None
        arch = self.field("general.architecture")
        if arch == "clip":
            raise GGUFError(f"{self.path} is a vision projector (mmproj) GGUF; gemma-batch runs the text model's GGUF "
                            "(the other file of the pair)")
        if arch != ARCH:
            raise GGUFError(f"{self.path} holds a {arch!r} model; gemma-batch runs Gemma 3 (GGUF architecture "
                            f"{ARCH!r})")
        size = self.path.stat().st_size
        self.tensors: list[GGUFTensor] = []
        self._data: dict[str, Any] = {}
        for t in self._reader.tensors:
            if t.data_offset + t.n_bytes > size:
                raise GGUFError(f"{self.path} is truncated: tensor {t.name} ends at byte {t.data_offset + t.n_bytes:,}, "
                                f"the file at {size:,}")
            target = hf_name(t.name)
            if target is None:
                raise GGUFError(f"{self.path}: tensor {t.name!r} is not part of a Gemma 3 text model")
            type_name = t.tensor_type.name
            shape = tuple(int(n) for n in reversed(t.shape.tolist()))  # GGUF lists the fastest dimension first
            self.tensors.append(GGUFTensor(t.name, target, type_name, shape, self._stored(type_name, target, shape)))
            self._data[t.name] = t
        self._check_types()
        self._fuse_formats()

    def _stored(self, type_name: str, target: str, shape: tuple[int, ...]) -> str:
        if type_name in _KEPT_TYPES:
            return _KEPT_TYPES[type_name]
        if len(shape) != 2 or shape[1] % 32:
            raise GGUFError(f"{self.path}: tensor of {type_name} and shape {list(shape)} is no matrix of whole groups of 32")
        return str(carried_format(type_name, target.removeprefix("model.")))

    def _fuse_formats(self) -> None:
        """A layer's q, k and v (one fused projection) and its gate and up (one fused dispatch) must
        share a format: where theirs differ, all of them are carried in int8 (a float one too)."""
        by_group: dict[tuple[str, str], list[int]] = {}
        for i, t in enumerate(self.tensors):
            match = _FUSED.fullmatch(t.hf_name)
            if match:
                by_group.setdefault((match.group(1), match.group(2) in ("gate", "up")), []).append(i)
        for members in by_group.values():
            if len({self.tensors[i].stored for i in members}) > 1:
                for i in members:
                    self.tensors[i] = replace(self.tensors[i], stored=str(INT8))

    def field(self, key: str, default: Any = None) -> Any:
        """A metadata value (a string, number, bool, or list), or `default` where the file lacks it."""
        found = self._reader.fields.get(key)
        return default if found is None else found.contents()

    def _check_types(self) -> None:
        """GGUFError for a tensor type the `gguf` package cannot dequantize (tried on one row)."""
        import gguf

        tried: set[str] = set()
        for t in self.tensors:
            if t.type_name in _KEPT_TYPES or t.type_name in tried:
                continue
            tried.add(t.type_name)
            raw = self._data[t.name]
            try:
                gguf.quants.dequantize(np.ascontiguousarray(raw.data.reshape(t.shape[0], -1)[:1]), raw.tensor_type)
            except NotImplementedError:
                raise GGUFError(f"{self.path}: tensor {t.name} is of type {t.type_name}, which gemma-batch cannot "
                                "dequantize (the `gguf` package has no reader for it); make another quantization "
                                "with llama.cpp's llama-quantize") from None

    def config(self) -> dict[str, Any]:
        """The model's Hugging Face `config.json` (`Gemma3ForCausalLM`, text fields at the top)."""
        def need(key: str) -> Any:
            value = self.field(f"{ARCH}.{key}")
            if value is None:
                raise GGUFError(f"{self.path}: the metadata lacks {ARCH}.{key}")
            return value

        layers, hidden, heads = int(need("block_count")), int(need("embedding_length")), int(need("attention.head_count"))
        head_dim = int(need("attention.key_length"))
        window = int(self.field(f"{ARCH}.attention.sliding_window", 0) or 0)
        embed = next(t for t in self.tensors if t.name == "token_embd.weight")
        rope_full: dict[str, Any] = {"rope_type": "default", "rope_theta": float(self.field(f"{ARCH}.rope.freq_base", 1e6))}
        scaling, factor = self.field(f"{ARCH}.rope.scaling.type"), self.field(f"{ARCH}.rope.scaling.factor")
        if scaling not in (None, "none") and factor not in (None, 1.0):
            if scaling != "linear":
                raise GGUFError(f"{self.path}: RoPE scaling {scaling!r}; Gemma 3 uses linear scaling")
            rope_full = {**rope_full, "rope_type": "linear", "factor": float(factor)}
        eos = [int(self.field("tokenizer.ggml.eos_token_id", 1))]
        if self.field("tokenizer.chat_template") is not None:  # an instruction-tuned model: a turn ends a reply
            eos += [i for i, piece in enumerate(self.field("tokenizer.ggml.tokens")) if piece == "<end_of_turn>"][:1]
        return {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "vocab_size": embed.shape[0],
            "hidden_size": hidden,
            "intermediate_size": int(need("feed_forward_length")),
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": int(need("attention.head_count_kv")),
            "head_dim": head_dim,
            "query_pre_attn_scalar": hidden // heads if layers == LAYERS_27B else head_dim,
            "sliding_window": window or int(need("context_length")),
            "layer_types": [("sliding_attention" if window and (i + 1) % SLIDING_PATTERN else "full_attention")
                            for i in range(layers)],
            "rope_parameters": {"full_attention": rope_full,
                                "sliding_attention": {"rope_type": "default", "rope_theta": LOCAL_ROPE_THETA}},
            "max_position_embeddings": int(need("context_length")),
            "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
            "final_logit_softcapping": self.field(f"{ARCH}.final_logit_softcapping"),
            "attn_logit_softcapping": None,
            "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": not any(t.name == "output.weight" for t in self.tensors),
            "bos_token_id": int(self.field("tokenizer.ggml.bos_token_id", 2)),
            "eos_token_id": eos if len(eos) > 1 else eos[0],
            "pad_token_id": int(self.field("tokenizer.ggml.padding_token_id", 0)),
            "torch_dtype": "float32",
        }

    def carried(self, tensor: GGUFTensor) -> Iterator[QuantizedTensor]:
        """A quantized matrix in its carried format (`tensor.stored`), ROWS_AT_ONCE rows at a time."""
        fmt = CARRIED[tensor.stored]
        data = self._data[tensor.name].data.reshape(tensor.shape[0], -1)
        for start in range(0, data.shape[0], ROWS_AT_ONCE):
            yield carry(np.ascontiguousarray(data[start : start + ROWS_AT_ONCE]), tensor.type_name, fmt)

    def values(self, tensor: GGUFTensor) -> Iterator[np.ndarray]:
        """The tensor's values in its `stored` dtype (F32: float32; F16: float16; BF16: the bits as
        uint16), ROWS_AT_ONCE rows at a time; norm weights less NORM_SHIFT."""
        import gguf

        raw = self._data[tensor.name]
        data = raw.data.reshape(tensor.shape[0], -1) if len(tensor.shape) > 1 else raw.data.reshape(1, -1)
        shift = tensor.hf_name.endswith("norm.weight")
        for start in range(0, data.shape[0], ROWS_AT_ONCE):
            block = data[start : start + ROWS_AT_ONCE]
            if tensor.stored == "BF16":
                values = np.ascontiguousarray(block).view(np.uint16)
            elif tensor.stored == "F16":
                values = np.ascontiguousarray(block).view(np.float16)
            else:
                values = gguf.quants.dequantize(np.ascontiguousarray(block), raw.tensor_type).astype(np.float32, copy=False)
            if shift:
                if tensor.stored != "F32":
                    raise GGUFError(f"{self.path}: norm weight {tensor.name} is {tensor.type_name}; expected F32")
                values = values - np.float32(NORM_SHIFT)
            yield values.reshape(-1) if len(tensor.shape) == 1 else values
