"""The numpy float32 backend: the reference every other backend is tested against.

It favours clarity over speed. Per step it loops in Python over layers, and inside attention over
the lengths of key windows; everything else is whole-array numpy.

Batch invariance (see `Backend.step`) is by construction, because BLAS does not promise it:
OpenBLAS sums a 1-row product (gemv) in another order than a many-row one, and may switch kernels
with the matrix size or its thread count. So every weight product runs in fixed tiles of
`ROW_TILE` rows (the last zero-padded) with BLAS on one thread, and each query attends over a
window of keys whose length depends only on how many keys it sees (`cpu_attention.py`); a
token's arithmetic then has the same shapes, hence the same rounding, in any batch and any
prefill chunking.

Weight formats (`model.quant`): bf16 and fp16 matrices are widened to float32 at load (exactly);
int8 and int4 matrices stay quantized and are dequantized W_ROWS output rows at a time inside the
product, so no dequantized copy of a matrix is ever held. KV formats: `kv_formats`.

Shapes: T tokens in the step, S sequences, H hidden, nh/nkv heads of hd, I intermediate, V vocab.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from threadpoolctl import ThreadpoolController

from ..model.checkpoint import Tensor, to_float32
from ..model.config import Gemma3Config, RopeSpec
from ..model.quant import FORMATS, QuantizedTensor
from ..model.weights import tensor_shapes
from .base import Backend, StepBatch, StepResult
from .cpu_attention import AttentionPlan, attend, attention_plan
from .kv_formats import KVStore, kv_slot_bytes, kv_token_bytes
from .sampler import sample_tokens

F32 = np.float32
ROW_TILE = 16  # rows per weight product: a fixed shape keeps BLAS on one code path
W_ROWS = 1024  # output rows of a matrix multiplied at a time (a quantized one: dequantized at a time)
# Matrices of at least this many weights are multiplied in blocks of W_ROWS output rows on the
# backend's threads; the blocks are the same whatever the number of threads, so are the sums.
THREADED_WEIGHTS = 1 << 21
MAX_THREADS = 8
Matrix = np.ndarray | QuantizedTensor


def matmul_rows(x: np.ndarray, w: Matrix, pool: ThreadPoolExecutor | None = None) -> np.ndarray:
    """x [T, K] @ w.T for w [N, K], in tiles of ROW_TILE rows so each row's result is batch-invariant;
    a quantized matrix, or one of THREADED_WEIGHTS or more, in blocks of W_ROWS output rows (on
    `pool`'s threads where given: the same blocks, so the same bits, as without)."""
    T, N = x.shape[0], w.shape[0]
    padded = np.zeros((-(-T // ROW_TILE) * ROW_TILE, x.shape[1]), F32)
    padded[:T] = x
    out = np.empty((padded.shape[0], N), F32)
    blocked = not isinstance(w, np.ndarray) or w.size >= THREADED_WEIGHTS
    starts = range(0, N, W_ROWS) if blocked else [0]

    def block(r: int) -> None:
        rows = slice(r, r + W_ROWS) if blocked else slice(None)
        weights = w[rows] if isinstance(w, np.ndarray) else w.dequantize(rows)  # (quantized: made as needed)
        for i in range(0, padded.shape[0], ROW_TILE):
            # As w @ tile.T: the tile's rows are the product's columns. OpenBLAS 0.3.31's small-matrix
            # sgemm sums a row of `tile @ w.T` in an order that depends on the row's place in the tile
            # (rows 6-15 differ from row 0 on Haswell); columns of `w @ tile.T` do not.
            out[i : i + ROW_TILE, rows] = (weights @ padded[i : i + ROW_TILE].T).T

    if pool is None or len(starts) == 1:
        for r in starts:
            block(r)
    else:
        list(pool.map(block, starts))
    return out[:T]


def embed_rows(table: Matrix, token_ids: np.ndarray) -> np.ndarray:
    """float32 rows of the embedding table for `token_ids`."""
    return table[token_ids] if isinstance(table, np.ndarray) else table.dequantize(token_ids)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Gemma's RMSNorm over the last axis, with the weight applied as (1 + w)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + F32(eps)) * (F32(1.0) + w)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (torch `gelu(approximate="tanh")`, HF `gelu_pytorch_tanh`):
    0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), in place on one temporary (the same
    operations in the same order as the expression, so the same bits, without its five temporaries)."""
    t = np.multiply(x, F32(0.044715))
    t *= x
    t *= x
    t += x
    t *= F32(np.sqrt(2.0 / np.pi))
    np.tanh(t, out=t)
    t += F32(1.0)
    t *= F32(0.5) * x
    return t


def rope_inv_freq(head_dim: int, spec: RopeSpec) -> np.ndarray:
    """[hd/2] float32: 1 / theta**(2i/hd) / factor, computed in fp32 as transformers does."""
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(F32) / F32(head_dim)
    return (F32(1.0) / (F32(spec.theta) ** exponent)) / F32(spec.factor)


def rope_cos_sin(positions: np.ndarray, head_dim: int, spec: RopeSpec) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [T, hd] for rotate-half RoPE; angles are the fp32 product p * inv_freq."""
    inv_freq = rope_inv_freq(head_dim, spec)  # [hd/2]
    angles = positions.astype(F32)[:, None] * inv_freq[None, :]  # [T, hd/2]
    angles = np.concatenate([angles, angles], axis=-1)  # [T, hd]
    return np.cos(angles), np.sin(angles)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [T, heads, hd] rotated by position: x*cos + rotate_half(x)*sin."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class CpuBackend(Backend):
    """Gemma 3 in numpy float32 over a paged KV cache."""

    name = "cpu"
    weight_formats = FORMATS

    def __init__(self, cfg: Gemma3Config, kv_dtype: str = "fp32", threads: int | None = None) -> None:
        """`threads`: how many of the products' blocks run at once (default: the CPUs this process
        may use, at most MAX_THREADS). BLAS itself runs one thread during a step: its own threads
        wait by spinning, and on a machine with other work running they made the README job 4-11x
        slower (docs/EXPERIMENTS.md, "The CPU backend on a busy machine"); the backend's threads
        take whole blocks and wait without spinning. The bits do not depend on the count."""
        super().__init__(cfg)
        kv_slot_bytes(kv_dtype, 1, 1)  # checks the name
        self.kv_dtype = kv_dtype
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        threads = threads or min(MAX_THREADS, usable)
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="gemma-batch-cpu") if threads > 1 else None
        self._blas = ThreadpoolController()
        self.weights: dict[str, Matrix] = {}  # canonical name -> float32 array or quantized matrix
        self.layers: list[dict[str, Matrix]] = []  # per layer: suffix -> the same arrays
        self.k_cache: dict[int, KVStore] = {}  # layer -> [num_blocks * block_size, nkv, hd]
        self.v_cache: dict[int, KVStore] = {}
        self.block_size = 0

    @property
    def identity(self) -> str:
        return "cpu" if self.kv_dtype == "fp32" else f"cpu, KV {self.kv_dtype}"

    def load_weights(self, tensors: Iterable[tuple[str, Tensor | QuantizedTensor]]) -> None:
        expected = tensor_shapes(self.cfg)
        for name, tensor in tensors:
            self.weights[name] = tensor if isinstance(tensor, QuantizedTensor) else to_float32(tensor)
        missing = sorted(set(expected) - set(self.weights))
        if missing:
            raise ValueError(f"backend received no tensor for {', '.join(missing[:5])} ({len(missing)} missing)")
        self.layers = [
            {k.split(".", 2)[2]: v for k, v in self.weights.items() if k.startswith(f"layers.{i}.")}
            for i in range(self.cfg.num_layers)
        ]

    def peak_memory(self) -> int:
        """The weights and KV arrays (the step's activations are small next to them)."""
        arrays = [*self.weights.values(), *self.k_cache.values(), *self.v_cache.values()]
        return sum(a.nbytes for a in arrays)

    def measure_read_bandwidth(self, nbytes: int) -> float:
        """numpy's sum over a float32 array, best of 3 (one core's streaming read)."""
        data = np.ones(nbytes // 4, F32)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            data.sum()
            best = min(best, time.perf_counter() - start)
        return data.nbytes / best

    def available_memory(self) -> int:
        """MemAvailable from /proc/meminfo (free pages plus reclaimable cache)."""
        try:
            with open("/proc/meminfo") as f:
                fields = dict(line.split(":", 1) for line in f)
            return int(fields["MemAvailable"].split()[0]) * 1024
        except (OSError, KeyError, ValueError):
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")

    def weight_bytes(self, tensor_bytes: Mapping[str, int]) -> int:
        """BF16 and F16 tensors are held as float32 (they double); quantized ones as they are."""
        return sum(n * (2 if dtype in ("BF16", "F16") else 1) for dtype, n in tensor_bytes.items())

    def kv_bytes_per_token(self, group: str) -> int:
        return kv_token_bytes(self.cfg, group, self.kv_dtype)

    def allocate_kv(self, num_blocks: Mapping[str, int], block_size: int) -> None:
        cfg = self.cfg
        self.block_size = block_size
        for group in cfg.kv_groups():
            slots = num_blocks[group.name] * block_size
            for layer in group.layers:
                self.k_cache[layer] = KVStore(self.kv_dtype, slots, cfg.num_kv_heads, cfg.head_dim)
                self.v_cache[layer] = KVStore(self.kv_dtype, slots, cfg.num_kv_heads, cfg.head_dim)

    def step(self, batch: StepBatch) -> StepResult:
        with self._blas.limit(limits=1, user_api="blas"):
            return self._step(batch)

    def _matmul(self, x: np.ndarray, w: Matrix) -> np.ndarray:
        return matmul_rows(x, w, self.pool)

    def _step(self, batch: StepBatch) -> StepResult:
        cfg, w = self.cfg, self.weights
        x = embed_rows(w["embed_tokens.weight"], batch.token_ids) * F32(cfg.embed_scale)  # [T, H]
        rope = {kind: rope_cos_sin(batch.positions, cfg.head_dim, spec) for kind, spec in cfg.rope.items()}
        plans = {g.name: attention_plan(batch, g.name, g.window, self.block_size) for g in cfg.kv_groups()}
        for layer, kind in enumerate(cfg.layer_types):
            x = self._layer(layer, x, rope[kind], plans[kind], batch.slots[kind])

        sampled = (batch.seq_starts[1:] - 1)[batch.sample]  # flat index of each sampled last token
        rows = np.arange(batch.num_tokens) if batch.return_logits else sampled
        logits = self._matmul(rms_norm(x[rows], w["norm.weight"], cfg.rms_norm_eps), self._lm_head())  # [R, V]
        next_ids = np.full(batch.num_seqs, -1, np.int32)
        sampled_logits = logits[sampled] if batch.return_logits else logits
        next_ids[batch.sample] = sample_tokens(sampled_logits, batch.sampling, np.flatnonzero(batch.sample))
        return StepResult(next_ids, logits if batch.return_logits else None)

    def _lm_head(self) -> Matrix:
        return self.weights.get("lm_head.weight", self.weights["embed_tokens.weight"])  # [V, H]

    def _layer(
        self,
        layer: int,
        x: np.ndarray,  # [T, H] residual stream
        rope: tuple[np.ndarray, np.ndarray],
        plan: AttentionPlan,
        slots: np.ndarray,  # [T]
    ) -> np.ndarray:
        cfg = self.cfg
        w = self.layers[layer]
        eps, T = cfg.rms_norm_eps, x.shape[0]

        a = rms_norm(x, w["input_layernorm.weight"], eps)
        q = self._matmul(a, w["self_attn.q_proj.weight"]).reshape(T, cfg.num_heads, cfg.head_dim)
        k = self._matmul(a, w["self_attn.k_proj.weight"]).reshape(T, cfg.num_kv_heads, cfg.head_dim)
        v = self._matmul(a, w["self_attn.v_proj.weight"]).reshape(T, cfg.num_kv_heads, cfg.head_dim)
        q = apply_rope(rms_norm(q, w["self_attn.q_norm.weight"], eps), *rope)  # QK-norm, then RoPE
        k = apply_rope(rms_norm(k, w["self_attn.k_norm.weight"], eps), *rope)
        self.k_cache[layer].write(slots, k)  # the cache holds K after norm and RoPE, V raw
        self.v_cache[layer].write(slots, v)

        o = attend(q, self.k_cache[layer], self.v_cache[layer], plan, cfg)
        attn = self._matmul(o.reshape(T, cfg.q_width), w["self_attn.o_proj.weight"])  # [T, H]
        x = x + rms_norm(attn, w["post_attention_layernorm.weight"], eps)

        b = rms_norm(x, w["pre_feedforward_layernorm.weight"], eps)
        gate = gelu_tanh(self._matmul(b, w["mlp.gate_proj.weight"]))  # [T, I]
        mlp = self._matmul(gate * self._matmul(b, w["mlp.up_proj.weight"]), w["mlp.down_proj.weight"])  # [T, H]
        return x + rms_norm(mlp, w["post_feedforward_layernorm.weight"], eps)
