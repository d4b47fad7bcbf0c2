"""A GGUF of the demo model written as llama.cpp writes a Gemma 3 one (names, w + 1 norms, metadata,
the SentencePiece vocabulary), through `gguf`'s own writer: the fixture of tests/test_gguf.py.

Matrices take the types `TYPES` cycles through, so that one small file holds every type a Gemma
GGUF uses. Types `gguf` can quantize are quantized from the demo's weights; K-quants (which it can
only read) get random blocks whose fp16 scales are set to small values, so their values are finite.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gemma_batch.job.spec import DEMO_MODEL

TYPES = ("Q8_0", "Q5_0", "Q4_K", "Q6_K", "Q4_0", "Q4_1", "Q5_1", "Q5_K", "F16", "BF16", "Q2_K", "Q3_K", "F32")
QUANTIZABLE = ("Q8_0", "Q5_0", "Q4_0", "Q4_1", "Q5_1", "F16", "BF16")  # what `gguf` can quantize
# K-quant blocks of 256 weights: (bytes, offsets of their fp16 scale fields); ggml-common.h's layouts
K_BLOCKS = {"Q2_K": (84, (80, 82)), "Q3_K": (110, (108,)), "Q4_K": (144, (0, 2)), "Q5_K": (176, (0, 2)),
            "Q6_K": (210, (208,))}
_LAYER_NAMES = {
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight", "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}


def demo_tensors() -> dict[str, np.ndarray]:
    """The demo model's tensors as float32, read from its safetensors file by hand."""
    raw = (DEMO_MODEL / "model.safetensors").read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header, data = json.loads(raw[8 : 8 + size]), raw[8 + size :]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        if entry["dtype"] == "BF16":
            values = (np.frombuffer(data[begin:end], "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            values = np.frombuffer(data[begin:end], "<f4").copy()
        out[name] = values.reshape(entry["shape"])
    return out


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{_LAYER_NAMES[rest]}"


def k_blocks(rows: int, cols: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks [rows, cols / 256 * block bytes] with small fp16 scales."""
    size, scales = K_BLOCKS[kind]
    blocks = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
    for offset in scales:
        values = rng.uniform(1e-4, 2e-3, (rows, cols // 256)).astype(np.float16)
        blocks[:, :, offset : offset + 2] = values[..., None].view(np.uint8).reshape(rows, cols // 256, 2)
    return blocks.reshape(rows, -1)


def write_gguf(path: Path, arch: str = "gemma3", types: tuple[str, ...] = TYPES, metadata: dict | None = None,
               extra_tensor: tuple[str, str] | None = None, seed: int = 0) -> dict[str, str]:
    """Write the demo model as a GGUF at `path`; return each Hugging Face name's GGUF type.
    `metadata` adds or replaces keys (None values remove them); `extra_tensor` (name, F32 or F16)
    adds a tensor of 4 zeros under that name."""
    import gguf
    from sentencepiece import sentencepiece_model_pb2 as pb

    rng = np.random.default_rng(seed)
    cfg = json.loads((DEMO_MODEL / "config.json").read_text())
    writer = gguf.GGUFWriter(str(path), arch)
    meta = {
        f"{arch}.context_length": cfg["max_position_embeddings"], f"{arch}.embedding_length": cfg["hidden_size"],
        f"{arch}.block_count": cfg["num_hidden_layers"], f"{arch}.feed_forward_length": cfg["intermediate_size"],
        f"{arch}.attention.head_count": cfg["num_attention_heads"],
        f"{arch}.attention.head_count_kv": cfg["num_key_value_heads"],
        f"{arch}.attention.key_length": cfg["head_dim"], f"{arch}.attention.value_length": cfg["head_dim"],
        f"{arch}.attention.layer_norm_rms_epsilon": cfg["rms_norm_eps"], f"{arch}.rope.freq_base": 1e6,
        f"{arch}.attention.sliding_window": cfg["sliding_window"],
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3, "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_space_prefix": False,
        **(metadata or {}),
    }
    proto = pb.ModelProto()
    proto.ParseFromString((DEMO_MODEL / "tokenizer.model").read_bytes())
    writer.add_array("tokenizer.ggml.tokens", [p.piece for p in proto.pieces])
    writer.add_array("tokenizer.ggml.scores", [p.score for p in proto.pieces])
    writer.add_array("tokenizer.ggml.token_type", [int(p.type) for p in proto.pieces])
    for key, value in meta.items():
        if value is None:
            continue
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_string(key, value)
    chosen = {}
    matrices = 0
    for hf, values in demo_tensors().items():
        name = gguf_name(hf)
        if values.ndim == 1:  # norms, stored as w + 1 in F32 as llama.cpp does
            writer.add_tensor(name, (values + np.float32(1.0)).astype(np.float32))
            chosen[hf] = "F32"
            continue
        kind = types[matrices % len(types)]
        matrices += 1
        chosen[hf] = kind
        qtype = gguf.GGMLQuantizationType[kind]
        if kind == "F32":
            writer.add_tensor(name, values.astype(np.float32))
        elif kind in K_BLOCKS:
            writer.add_tensor(name, k_blocks(*values.shape, kind, rng), raw_dtype=qtype)
        elif kind in QUANTIZABLE:
            writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
        else:  # a type `gguf` cannot read: zero blocks of its size
            block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
            writer.add_tensor(name, np.zeros((values.shape[0], values.shape[1] // block * nbytes), np.uint8), raw_dtype=qtype)
    if extra_tensor is not None:
        name, kind = extra_tensor
        writer.add_tensor(name, np.zeros(4, np.float32) if kind == "F32" else np.zeros(4, np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return chosen
