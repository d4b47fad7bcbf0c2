"""The Gemma 3 text weights: Hugging Face names (without the layout prefix) and shapes.

Every Linear weight is stored `[out, in]` and applied as `y = x @ W.T`. Norm weights are offsets
around zero, applied as `(1 + w)`. The LM head is the embedding table unless the checkpoint
carries `lm_head.weight` (tie_word_embeddings false).
"""

from __future__ import annotations

from .config import Gemma3Config


def layer_tensor_shapes(cfg: Gemma3Config) -> dict[str, tuple[int, ...]]:
    """Shapes of one decoder layer's tensors, keyed by the suffix after `layers.{i}.`."""
    h, i, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    return {
        "input_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (cfg.q_width, h),  # [nh*hd, H]
        "self_attn.k_proj.weight": (cfg.kv_width, h),  # [nkv*hd, H]
        "self_attn.v_proj.weight": (cfg.kv_width, h),
        "self_attn.q_norm.weight": (hd,),  # shared by all heads
        "self_attn.k_norm.weight": (hd,),
        "self_attn.o_proj.weight": (h, cfg.q_width),
        "post_attention_layernorm.weight": (h,),  # on the attention output, before the residual add
        "pre_feedforward_layernorm.weight": (h,),
        "mlp.gate_proj.weight": (i, h),
        "mlp.up_proj.weight": (i, h),
        "mlp.down_proj.weight": (h, i),
        "post_feedforward_layernorm.weight": (h,),  # on the MLP output, before the residual add
    }


def tensor_shapes(cfg: Gemma3Config) -> dict[str, tuple[int, ...]]:
    """Every text tensor the model needs, by canonical name (`embed_tokens.weight`,
    `layers.{i}.<suffix>`, `norm.weight`, and `lm_head.weight` when the head is untied)."""
    shapes = {"embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size)}
    per_layer = layer_tensor_shapes(cfg)
    for layer in range(cfg.num_layers):
        for suffix, shape in per_layer.items():
            shapes[f"layers.{layer}.{suffix}"] = shape
    shapes["norm.weight"] = (cfg.hidden_size,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, cfg.hidden_size)
    return shapes
