"""The text-decoder shapes of the published Gemma 3 checkpoints, for benchmarks on random weights.

Each entry is written in Hugging Face `Gemma3TextConfig` fields, so that the transformers peer
(`benchmarks/hf_peer.py`) builds the very same model from it; values from gemma3_spec.md §1 (270m: the published
Gemma 3 270M's config).
4B/12B/27B scale the global layers' RoPE linearly by 8. `tiny` is for tests: every layer kind
(two sliding, two global), GQA, and a window shorter than the prompts.
"""

from __future__ import annotations

from typing import Any

from ..model.config import Gemma3Config

_LINEAR_8 = {"rope_type": "linear", "factor": 8.0}

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=512, sliding_window=8, query_pre_attn_scalar=16,
                 layer_types=["sliding_attention", "full_attention"] * 2, max_position_embeddings=4096),
    "270m": dict(hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
                 num_key_value_heads=1, head_dim=256, vocab_size=262144, sliding_window=512, query_pre_attn_scalar=256,
                 max_position_embeddings=32768),
    "1b": dict(hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
               num_key_value_heads=1, head_dim=256, vocab_size=262144, sliding_window=512, query_pre_attn_scalar=256,
               max_position_embeddings=32768),
    "4b": dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8,
               num_key_value_heads=4, head_dim=256, vocab_size=262208, sliding_window=1024, query_pre_attn_scalar=256,
               rope_scaling=_LINEAR_8),
    "12b": dict(hidden_size=3840, intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
                num_key_value_heads=8, head_dim=256, vocab_size=262208, sliding_window=1024, query_pre_attn_scalar=256,
                rope_scaling=_LINEAR_8),
    "27b": dict(hidden_size=5376, intermediate_size=21504, num_hidden_layers=62, num_attention_heads=32,
                num_key_value_heads=16, head_dim=128, vocab_size=262208, sliding_window=1024, query_pre_attn_scalar=168,
                rope_scaling=_LINEAR_8),
}


def shape_config(name: str) -> Gemma3Config:
    """The resolved config of shape `name` (a `Gemma3ForCausalLM` layout; other fields: defaults)."""
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; available: {', '.join(SHAPES)}")
    return Gemma3Config.from_dict({"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], **SHAPES[name]})


def hf_fields(cfg: Gemma3Config) -> dict[str, Any]:
    """A model's sizes as the `Gemma3TextConfig` fields of SHAPES name them (for reports)."""
    return dict(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
                num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                vocab_size=cfg.vocab_size, sliding_window=cfg.sliding_window,
                query_pre_attn_scalar=cfg.query_pre_attn_scalar, max_position_embeddings=cfg.max_position_embeddings)
