"""Tiny random Gemma 3 checkpoints written by transformers itself, in both hub layouts.

The shapes are chosen so that every Gemma 3 quirk matters: GQA (4 query heads on 2 KV heads),
head_dim (24) != hidden/heads (16), query_pre_attn_scalar (20) != head_dim, a sliding window (8)
much shorter than the prompts, linear RoPE scaling on the global layers only, and norm weights
drawn around zero so that the (1 + w) form matters.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Gemma3Config as HFGemma3Config
from transformers import Gemma3ForCausalLM, Gemma3ForConditionalGeneration, Gemma3TextConfig, SiglipVisionConfig

TINY_TEXT = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,
    query_pre_attn_scalar=20,
    sliding_window=8,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
    rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    },
    max_position_embeddings=512,
    eos_token_id=[1, 106],
)


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Norm weights ~ N(0, 0.3) (so that 1 + w matters), matrices ~ N(0, 0.08)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            std = 0.3 if "norm" in name else 0.08
            p.copy_(torch.randn(p.shape, generator=gen) * std)


def make_causal_lm(out_dir: Path, seed: int = 0, **overrides) -> Gemma3ForCausalLM:
    """Write a tiny `Gemma3ForCausalLM` checkpoint (the 1B's layout) and return the float32 model."""
    cfg = Gemma3TextConfig(**{**TINY_TEXT, **overrides})
    model = Gemma3ForCausalLM(cfg).eval()
    randomize_(model, seed)
    model.save_pretrained(out_dir)
    return model


def make_conditional_generation(out_dir: Path, text_model: Gemma3ForCausalLM, **save_kwargs) -> torch.nn.Module:
    """Write the same text weights in the multimodal layout (`language_model.model.*` plus a tiny
    SigLIP tower), as the 4B/12B/27B hub checkpoints are, and return that model."""
    vision = SiglipVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    cfg = HFGemma3Config(text_config=text_model.config.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=1)
    cfg.eos_token_id = [1, 106]
    model = Gemma3ForConditionalGeneration(cfg).eval()
    randomize_(model, seed=99)
    missing, unexpected = model.model.language_model.load_state_dict(text_model.model.state_dict(), strict=True)
    assert not missing and not unexpected
    model.save_pretrained(out_dir, **save_kwargs)
    return model
