"""The numpy float32 backend: the reference every other backend is tested against.

It favours clarity over speed. Per step it loops in Python over layers, and inside attention over
the lengths of key windows; everything else is whole-array numpy. A step of at least as many tiles
of rows as threads runs each layer on the backend's threads, a part of the rows a thread
(`cpu_parts.row_parts`); a smaller one gives the threads the blocks of its matrices
(`cpu_math.block_rows`) and its attention a tile at a time.

Batch invariance (see `Backend.step`) is by construction, because BLAS does not promise it:
OpenBLAS sums a 1-row product (gemv) in another order than a many-row one, and may switch kernels
with the matrix size or its thread count. So every weight product runs in fixed tiles of
`ROW_TILE` rows (the last zero-padded) with BLAS on one thread, and each query attends over a
window of keys whose length depends only on how many keys it sees (`cpu_attention.py`); a
token's arithmetic then has the same shapes, hence the same rounding, in any batch and any
prefill chunking.

Weight formats (`model.quant`): bf16 and fp16 matrices are widened to float32 at load (exactly);
int8 and int4 matrices stay quantized and are dequantized a block of output rows at a time inside the
product; in a step of several row parts, once for all of them into two float32 buffers the size of
the largest layer matrix (`cpu_parts.py`), not once a part. KV formats: `kv_formats`.

Shapes: T tokens in the step, S sequences, H hidden, nh/nkv heads of hd, I intermediate, V vocab.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from threadpoolctl import ThreadpoolController

from ..model.checkpoint import Tensor, to_float32
from ..model.config import Gemma3Config
from ..model.quant import FORMATS, QuantizedTensor
from ..model.weights import tensor_shapes
from .base import Backend, StepBatch, StepResult
from .cpu_attention import AttentionPlan, attend_tiles, attention_plan
from .cpu_math import (F32, MAX_THREADS, Matrix, apply_rope, embed_rows, gelu_tanh, matmul_each, matmul_rows,
                       rms_norm, rope_cos_sin)
from .cpu_parts import ROW_TILE, on_parts, row_parts
from .kv_formats import KVStore, kv_label, kv_slot_bytes, kv_token_bytes
from .placement import Segment, held_tensors
from .sampler import sample_tokens, scores


Observer = Callable[[int, str, np.ndarray], None]
STEP_TOKENS = 8192  # the step budget a job takes by default (`default_step_tokens`), at most
STEP_ROWS_BYTES = 1 << 28  # ... and a step's widest activation [T, max(I, nh * hd)] float32 at most


class CpuBackend(Backend):
    """Gemma 3 in numpy float32 over a paged KV cache."""

    name = "cpu"
    weight_formats = FORMATS
    default_kv_dtype = "fp32"

    def __init__(self, cfg: Gemma3Config, kv_dtype: str = default_kv_dtype, threads: int | None = None,
                 segments: Sequence[Segment] | None = None, observe: Observer | None = None) -> None:
        """`threads`: how many of the products' blocks run at once (default: the CPUs this process
        may use, at most MAX_THREADS). BLAS itself runs one thread during a step: its own threads
        wait by spinning, and on a machine with other work running they made the README job 4-11x
        slower (docs/EXPERIMENTS.md, "The CPU backend on a busy machine"); the backend's threads
        take whole blocks and wait without spinning. The bits do not depend on the count.
        `segments`: the parts this backend runs as a pipeline stage (`Backend.run_segment`).
        `observe(layer, input, rows)` sees the rows [T, K] that each of a layer's products takes
        (`input`: "qkv", "o", "gate_up" or "down"), from the backend's threads, a part of the rows
        at a time (`quantize.calibration` sums them)."""
        super().__init__(cfg, segments)
        kv_slot_bytes(kv_dtype, 1, 1)  # checks the name
        self.kv_dtype = kv_dtype
        self.observe = observe
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        self.threads = threads or min(MAX_THREADS, usable)
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="gemma-batch-cpu") if self.threads > 1 else None
        self._blas = ThreadpoolController()
        self.weights: dict[str, Matrix] = {}  # canonical name -> float32 array or quantized matrix
        self._widening: list[np.ndarray] = []  # SharedWidening's two buffers, where layer matrices are quantized
        self.layers: list[dict[str, Matrix]] = []  # per layer: suffix -> the same arrays
        self.k_cache: dict[int, KVStore] = {}  # layer -> [num_blocks * block_size, nkv, hd]
        self.v_cache: dict[int, KVStore] = {}
        self.block_size = 0
        self._tables: tuple = (None, {}, {})  # (the step, its RoPE tables and attention plans by kind)

    @property
    def default_step_tokens(self) -> int:
        """Long steps: a step widens every quantized matrix once and pays the layers' hand-offs once
        (the 270M's 64 x 200-token job on 8 threads: 17-21 s, not 23-34 s, with 512-token steps:
        docs/EXPERIMENTS.md, "The CPU step budget"). Up to STEP_TOKENS, fewer where a step's widest
        activation would pass STEP_ROWS_BYTES (27b: 3,072 tokens)."""
        least = super().default_step_tokens  # (also the step the budget is a multiple of)
        row_bytes = 4 * max(self.cfg.intermediate_size, self.cfg.q_width)
        return max(least, min(STEP_TOKENS, STEP_ROWS_BYTES // row_bytes // least * least))

    @property
    def identity(self) -> str:
        return "cpu" if self.kv_dtype == "fp32" else f"cpu, KV {kv_label(self.kv_dtype, self.cfg.head_dim)}"

    def load_weights(self, tensors: Iterable[tuple[str, Tensor | QuantizedTensor]]) -> None:
        cfg = self.cfg
        expected = tensor_shapes(cfg) if self.segments is None else held_tensors(
            tensor_shapes(cfg), self.segments, cfg.num_layers, cfg.tie_word_embeddings)
        for name, tensor in tensors:
            self.weights[name] = tensor if isinstance(tensor, QuantizedTensor) else to_float32(tensor)
        missing = sorted(set(expected) - set(self.weights))
        if missing:
            raise ValueError(f"backend received no tensor for {', '.join(missing[:5])} ({len(missing)} missing)")
        self.layers = [
            {k.split(".", 2)[2]: v for k, v in self.weights.items() if k.startswith(f"layers.{i}.")}
            for i in range(self.cfg.num_layers)
        ]
        largest = max((w.shape[0] * w.shape[1] for layer in self.layers for w in layer.values()
                       if isinstance(w, QuantizedTensor)), default=0)
        self._widening = [np.empty(largest, F32) for _ in range(2)] if largest and self.threads > 1 else []

    def close(self) -> None:
        """Stop the backend's threads (the memory is the process's own)."""
        if self.pool is not None:
            self.pool.shutdown()

    def peak_memory(self) -> int:
        """The weights and KV arrays (the step's activations are small next to them)."""
        arrays = [*self.weights.values(), *self.k_cache.values(), *self.v_cache.values(), *self._widening]
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
        """BF16 and F16 tensors are held as float32 (they double); quantized ones as they are, and
        with more than one thread two float32 buffers of the largest layer matrix to widen them."""
        cfg = self.cfg
        quantized = any(dtype not in ("BF16", "F16", "F32") for dtype in tensor_bytes)  # (INT8, INT4, INT5)
        widening = 2 * 4 * cfg.hidden_size * max(cfg.intermediate_size, cfg.q_width) if self.threads > 1 and quantized else 0
        return widening + sum(n * (2 if dtype in ("BF16", "F16") else 1) for dtype, n in tensor_bytes.items())

    def kv_bytes_per_token(self, group: str) -> int:
        return kv_token_bytes(self.cfg, group, self.kv_dtype, self.kv_layers)

    def allocate_kv(self, num_blocks: Mapping[str, int], block_size: int) -> None:
        cfg = self.cfg
        self.block_size = block_size
        self._tables = (None, {}, {})  # (plans depend on the block size)
        for group in cfg.kv_groups():
            slots = num_blocks[group.name] * block_size
            for layer in filter(self.kv_layers.__contains__, group.layers):
                self.k_cache[layer] = KVStore(self.kv_dtype, slots, cfg.num_kv_heads, cfg.head_dim)
                self.v_cache[layer] = KVStore(self.kv_dtype, slots, cfg.num_kv_heads, cfg.head_dim)

    def step(self, batch: StepBatch) -> StepResult:
        with self._blas.limit(limits=1, user_api="blas"):
            return self._run(batch, None, 0, 2 * self.cfg.num_layers + 1)

    def run_segment(self, index: int, batch: StepBatch, x: np.ndarray | None,
                    out: np.ndarray | None = None) -> np.ndarray | StepResult:
        segment = self.segments[index]
        with self._blas.limit(limits=1, user_api="blas"):
            return self._run(batch, x, segment.first, segment.last, out)

    def _run(self, batch: StepBatch, x: np.ndarray | None, first: int, last: int,
             out: np.ndarray | None = None) -> np.ndarray | StepResult:
        """Parts `first..last` of the path (placement.py: 0 the embedding, 2i+1 and 2i+2 layer
        i's attention and feed-forward block, 2L+1 the head) from `x` [T, H] (or the tokens);
        the last part's residual sums go into `out` where given."""
        cfg, w = self.cfg, self.weights
        if first == 0:
            x = embed_rows(w["embed_tokens.weight"], batch.token_ids) * F32(cfg.embed_scale)  # [T, H]
        if self._tables[0] is not batch:  # (once a step: a stage may run several segments of it)
            self._tables = (batch, {kind: rope_cos_sin(batch.positions, cfg.head_dim, spec) for kind, spec in cfg.rope.items()},
                            {g.name: attention_plan(batch, g.name, g.window, self.block_size) for g in cfg.kv_groups()})
        _, rope, plans = self._tables
        parts = range(max(first, 1), min(last, 2 * cfg.num_layers) + 1)
        for part in parts:
            layer = (part - 1) // 2
            kind = cfg.layer_types[layer]
            dst = out if part == parts[-1] else None
            if part % 2:
                x = self._attention(layer, x, rope[kind], plans[kind], batch.slots[kind], dst)
            else:
                x = self._feed_forward(layer, x, dst)
        return self._head(batch, x) if last == 2 * cfg.num_layers + 1 else x

    def _head(self, batch: StepBatch, x: np.ndarray) -> StepResult:
        """The final norm, the logits of the rows the step asks for, and the sampler."""
        cfg, w = self.cfg, self.weights
        sampled = (batch.seq_starts[1:] - 1)[batch.sample]  # flat index of each sampled last token
        extra = np.zeros(0, np.int32) if batch.logit_rows is None else batch.logit_rows
        scored = batch.score_rows()
        rows = np.concatenate([np.arange(batch.num_tokens) if batch.return_logits else sampled, extra, scored])
        logits = matmul_rows(rms_norm(x[rows], w["norm.weight"], cfg.rms_norm_eps), self._lm_head(), self.pool)  # [R, V]
        first, last = len(rows) - len(extra) - len(scored), len(rows) - len(scored)
        logits, row_logits, score_logits = logits[:first], logits[first:last], logits[last:]
        next_ids = np.full(batch.num_seqs, -1, np.int32)
        sampled_logits = logits[sampled] if batch.return_logits else logits
        next_ids[batch.sample] = sample_tokens(sampled_logits, batch.sampling, np.flatnonzero(batch.sample))
        return StepResult(next_ids, logits if batch.return_logits else None,
                          None if batch.logit_rows is None else row_logits,
                          None if batch.score_tokens is None else
                          scores(score_logits, scored, batch.sampling, batch.score_tokens, batch.score_ids))

    def _lm_head(self) -> Matrix:
        return self.weights.get("lm_head.weight", self.weights["embed_tokens.weight"])  # [V, H]

    def _attention(
        self,
        layer: int,
        x: np.ndarray,  # [T, H] residual stream
        rope: tuple[np.ndarray, np.ndarray],
        plan: AttentionPlan,
        slots: np.ndarray,  # [T]
        out: np.ndarray | None = None,  # [T, H]: where the result goes (None: a new array)
    ) -> np.ndarray:
        """A decoder layer's attention block, x + post_norm(o(attend(qkv(norm(x))))); a part of
        the rows a thread (`cpu_parts.row_parts`), each row's arithmetic the same in any part. Every
        part's keys are written before any query reads them."""
        cfg = self.cfg
        w = self.layers[layer]
        eps = cfg.rms_norm_eps
        parts, shared = row_parts(x.shape[0], self.threads, self._widening)
        pool = self.pool if len(parts) == 1 else None  # the threads take parts, or else blocks

        def qkv(part: int) -> np.ndarray:
            rows, widen = parts[part], None if shared is None else (shared, part)
            T = rows.stop - rows.start
            a = rms_norm(x[rows], w["input_layernorm.weight"], eps)
            if self.observe:
                self.observe(layer, "qkv", a)
            q, k, v = matmul_each(a, [w[f"self_attn.{n}_proj.weight"] for n in "qkv"], pool, widen)
            q = q.reshape(T, cfg.num_heads, cfg.head_dim)
            k, v = (t.reshape(T, cfg.num_kv_heads, cfg.head_dim) for t in (k, v))
            cos, sin = (table[rows] for table in rope)
            q = apply_rope(rms_norm(q, w["self_attn.q_norm.weight"], eps), cos, sin)  # QK-norm, then RoPE
            k = apply_rope(rms_norm(k, w["self_attn.k_norm.weight"], eps), cos, sin)
            self.k_cache[layer].write(slots[rows], k)  # the cache holds K after norm and RoPE, V raw
            self.v_cache[layer].write(slots[rows], v)
            return q

        result = np.empty_like(x) if out is None else out

        def rest(part: int, q: np.ndarray) -> None:
            rows, widen = parts[part], None if shared is None else (shared, part)
            T = rows.stop - rows.start
            o = attend_tiles(pool, q, self.k_cache[layer], self.v_cache[layer], plan.rows(rows), cfg, ROW_TILE)
            o = o.reshape(T, cfg.q_width)
            if self.observe:
                self.observe(layer, "o", o)
            attn = matmul_rows(o, w["self_attn.o_proj.weight"], pool, widen)  # [T, H]
            np.add(x[rows], rms_norm(attn, w["post_attention_layernorm.weight"], eps), out=result[rows])

        if len(parts) == 1:
            rest(0, qkv(0))
        else:
            on_parts(self.pool, shared, rest, range(len(parts)), on_parts(self.pool, shared, qkv, range(len(parts))))
        return result

    def _feed_forward(self, layer: int, h: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """A decoder layer's feed-forward block, h + post_norm(down(gelu(gate(b)) * up(b))) for
        b = norm(h) [T, H], rows split between the threads as in `_attention`; into `out` where
        given."""
        w, eps = self.layers[layer], self.cfg.rms_norm_eps
        parts, shared = row_parts(h.shape[0], self.threads, self._widening)
        pool = self.pool if len(parts) == 1 else None

        result = np.empty_like(h) if out is None else out

        def ffn(part: int) -> None:
            rows, widen = parts[part], None if shared is None else (shared, part)
            b = rms_norm(h[rows], w["pre_feedforward_layernorm.weight"], eps)
            gate, up = matmul_each(b, [w["mlp.gate_proj.weight"], w["mlp.up_proj.weight"]], pool, widen)  # [T, I]
            gated = gelu_tanh(gate) * up
            if self.observe:
                self.observe(layer, "gate_up", b)
                self.observe(layer, "down", gated)
            mlp = matmul_rows(gated, w["mlp.down_proj.weight"], pool, widen)  # [T, H]
            np.add(h[rows], rms_norm(mlp, w["post_feedforward_layernorm.weight"], eps), out=result[rows])

        if len(parts) == 1:
            ffn(0)
        else:
            on_parts(self.pool, shared, ffn, range(len(parts)))
        return result
