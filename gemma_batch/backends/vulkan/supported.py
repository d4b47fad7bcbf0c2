"""Which model shapes the Vulkan backend's shaders handle: checked when the backend is made, before
anything is allocated, so that an unsupported model is refused up front (the CPU backend runs it)."""

from __future__ import annotations

from ...model.config import Gemma3Config
from .variants import ATTENTION_MAX_GROUP, ATTENTION_MAX_QUERIES, POST_NORM_MAX_ROW, matmul_cols


def check_supported(cfg: Gemma3Config) -> None:
    """Refuse, before anything is allocated, the shapes the shaders do not handle."""
    group = cfg.num_heads // cfg.num_kv_heads
    cols = matmul_cols("norm_qk_rope_float16")  # a workgroup's outputs stay within one head
    problems = [
        (cfg.hidden_size % 8 == 0, f"hidden_size {cfg.hidden_size} is not a multiple of 8"),
        (cfg.hidden_size <= POST_NORM_MAX_ROW,
         f"hidden_size {cfg.hidden_size} exceeds the post-norm epilogue's {POST_NORM_MAX_ROW}"),
        (cfg.q_width % 8 == 0, f"num_heads * head_dim {cfg.q_width} is not a multiple of 8"),
        (cfg.intermediate_size % 8 == 0, f"intermediate_size {cfg.intermediate_size} is not a multiple of 8"),
        (cfg.head_dim % cols == 0 and cfg.head_dim <= 256, f"head_dim {cfg.head_dim} must be a multiple of {cols} and at most 256"),
        (cfg.head_dim % 8 == 0, f"head_dim {cfg.head_dim} is not a multiple of 8 (attention reads rows in 16-byte pieces)"),
        (group <= ATTENTION_MAX_GROUP, f"{group} query heads per KV head exceed the attention kernel's {ATTENTION_MAX_GROUP}"),
        (group * cfg.head_dim <= ATTENTION_MAX_QUERIES,
         f"{group} query heads per KV head of head_dim {cfg.head_dim} ({group * cfg.head_dim} values) exceed "
         f"the attention kernel's {ATTENTION_MAX_QUERIES}"),
    ]
    bad = [message for ok, message in problems if not ok]
    if bad:
        raise ValueError(f"the Vulkan backend cannot run this model: {'; '.join(bad)}; use --backend cpu")
