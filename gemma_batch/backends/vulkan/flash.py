"""Which tokens of a step run prefill attention on the matrix units (`shaders/attention_flash.comp`),
and the tiles it takes them in.

A prompt token (a position below its sequence's prompt length, `StepBatch.prompt_lens`) runs the
flash kernel; every other token (decode tokens, and generated tokens recomputed after a
preemption) runs attention.comp. The two kernels sum in different orders, so the choice follows
the token alone, never the batch or the step's size: a prompt's last chunk of one token still
goes to the flash kernel.

The flash kernel runs where the cooperative-matrix path does (coopmat.py), for models whose
head_dim is a multiple of 32 up to 256 and whose query heads per KV head divide FLASH_ROWS (every
Gemma 3), with KV pages of fp16 (the default), bf16 or int8: it multiplies K and V as fp16, which
holds those exactly (int8: code times scale, rounded once), while fp32 pages are asked for fp32
attention and keep attention.comp. `GEMMA_BATCH_VK_FLASH=0` turns it off: every token on
attention.comp, as before.

Tiles: each sequence's prompt tokens of the step, cut into runs of FLASH_ROWS / G consecutive
tokens (the kernel's rows are (token, query head) pairs); a workgroup per (tile, KV head).
"""

from __future__ import annotations

import numpy as np

from ...model.config import Gemma3Config
from ...switches import switched_on
from ..base import StepBatch

ENV = "GEMMA_BATCH_VK_FLASH"
FLASH_ROWS = 64  # BM of attention_flash.comp: query rows of a workgroup
MAX_HEAD_DIM = 256  # the kernel's staging of K, V and Q rows fits 48 KiB of shared memory up to it


def flash_fits(cfg: Gemma3Config, kv_dtype: str) -> bool:
    """Whether attention_flash.comp serves the model's head shape with pages of `kv_dtype` (--kv-dtype)."""
    group = cfg.num_heads // cfg.num_kv_heads
    return (cfg.head_dim % 32 == 0 and cfg.head_dim <= MAX_HEAD_DIM and FLASH_ROWS % group == 0
            and kv_dtype != "fp32")


def wanted() -> bool:
    """The user's switch (GEMMA_BATCH_VK_FLASH=0 turns the flash kernel off)."""
    return switched_on(ENV)


def tiles(batch: StepBatch, prompt: np.ndarray, per_tile: int) -> np.ndarray:
    """[tiles, 4] int32 (first flat token, tokens, sequence, 0): each sequence's prompt tokens (a
    prefix of its tokens in the step) in runs of at most `per_tile`."""
    out = []
    for s in range(batch.num_seqs):
        start, end = int(batch.seq_starts[s]), int(batch.seq_starts[s + 1])
        count = int(prompt[start:end].sum())
        out += [(start + k, min(per_tile, count - k), s, 0) for k in range(0, count, per_tile)]
    return np.asarray(out, np.int32).reshape(-1, 4)


def step_tiles(batch: StepBatch, cfg: Gemma3Config, prompt: np.ndarray) -> np.ndarray:
    """The tiles (`tiles`, FLASH_ROWS / G tokens each) of the step's `prompt` tokens ([T] bool, StepBatch.prompt_mask)."""
    return tiles(batch, prompt, FLASH_ROWS // (cfg.num_heads // cfg.num_kv_heads))
