"""The Gemma 3 step as a sequence of dispatches, recorded once into a command buffer and replayed.

GPU timestamps bracket the step; with `profile` one more follows each dispatch
(`profile_timeline`: time per dispatch in order, or the whole step as "step").

Nothing in the recording depends on the step's size: kernels read T, S and R from the step
header and every dispatch takes its grid from the indirect buffer, which the host fills per step
(`grids`, grids.py). The command buffer is recorded when a step first needs it, and again only
when the step buffers grow. (The cooperative path records several: by step size, prompt tokens
and decode steps, recordings.py; `command_buffer` picks.) The backend keeps a graph per input set (step_buffers.StepInputs), so
that a step can be submitted while the one before it runs; a barrier at the start of each
recording orders it after that step.

Per step (shapes for T tokens, R logits rows):

    fill counters    0 (the matmul epilogues', the attention merge's and row_sync)
    embed            x [T, H]          = E[tokens] * sqrt(H)   (a token id -1 - r: row r of the ids
                                         the step before sampled, read from the other input set)
    per layer:
      matmul norm_qk_rope
                     qkv [T, q+2kv]    = rms(x)(1 + input_ln) . Wqkv, then per head: QK-norm, RoPE,
                                         q [T, nh, hd], K/V pages at the tokens' slots
      attention      attn [T, nh, hd]  over each token's visible keys, split into chunks of
                                         positions (a workgroup per chunk, token and kv head; the
                                         last chunk to finish merges them, see attention.comp)
      attention_flash                    the same for the step's prompt tokens, on the matrix units
                                         (recordings "+flash", steps with prompt tokens; flash.py)
      matmul post_norm
                     y [T, H]          = attn . Wo, then x += rms(y)(1 + post_attention_ln)
      matmul gated   act [T, I]        = gelu(rms(x)(1 + pre_ff_ln) . Wgate) * (... . Wup)
      matmul post_norm
                     y [T, H]          = act . Wdown, then x += rms(y)(1 + post_ff_ln)
    matmul rows      logits [R, V]     = rms(x[rows])(1 + norm) . E
    row_scores       scores [P]        = log-softmax of the score rows at their pairs' ids
    (wait)                               for the host's grammar masks, where they come while the
                                         step runs (`masks_ready`, host_event.py)
    sample           ids [R]

A pipeline stage (`segment`, placement.py) records only its parts: it starts from the stream the
stage before handed over (x = x_in, by embed_f32 on rows 0..T-1) where it has no embedding, ends
by handing x on (x_out = x) where it has no head, and fuses nothing across its edges.

On a device with cooperative matrices (`Device.coopmat`), each matmul whose shape fits
(coop_tiles.coop_fits) and whose weights are int8, int4 or fp16 tiles (weights.py stores every bf16
or fp16 matrix that fits as tiles there) is three dispatches instead: `split` writes its input
(normalised where the kind fuses the norm; the gathered rows for the LM head) as fp16 hi + lo,
`coop` multiplies on the matrix units into partial sums per K chunk (steps of up to the decode
tiles' rows, coop_tiles.coop_decode_rows: matmul_coop_direct.comp for tiles, matmul_coop.comp's decode tile for
int8 / int4; longer steps: matmul_coop.comp's prefill tile, the same sums; the step's prompt tokens,
which come last, on the prompt tile: one sum over all of K, shaders/partial_rows.glsl), and
`reduce` adds the chunks and runs the kind's epilogue (the same code as matmul.comp's). Where the next matmul
is on that path too, the reduces of o (post-norm), gate/up and down (post-norm) write its split
themselves (reduce.comp SPLIT_NEXT), and attention writes o's (attention.comp SPLIT_OUT), so a
layer is 9 dispatches: qkv, reduce, attention, o, reduce, gate/up, reduce, down, reduce (and the
first layer's split before them). In decode steps (recordings.py) it is 8:
attention sums qkv's chunks and runs its epilogue itself (attention.comp QK_IN; which layers may,
coop_plan.py). Outside the prefill recordings the LM head of one K chunk writes its logits itself
(matmul_coop_direct.comp Y_OUT), with no reduce. Fewer is faster at small batches: on the H100 a
dependent dispatch costs about 9 us at 4b batch 1, whatever its work, most of it the first memory
round trips of the kernel after the barrier (an empty dispatch costs about 1.6 us;
docs/EXPERIMENTS.md, "The post-norm reduce in two stages").
"""

from __future__ import annotations

import numpy as np

from ...model.config import Gemma3Config
from .coop_plan import CoopPlan
from .coop_tiles import chunk_tile_wanted, coop_chunks, logits_in_tile_wanted
from .graph_coop import CoopMatmul
from .grids import DispatchGrids
from .host_event import HostEvent
from .kernels import META_BINDING, Kernels
from .variants import matmul_cols, matmul_variant
from .memory import Buffer
from .step_buffers import StepBuffers
from .recordings import DECODE_MODES, FLASH, recording_for, recording_modes
from .timestamps import Timestamps
from .weights import DeviceWeights


STAMPS_PER_LAYER = 28  # timestamps a layer's dispatches take with `profile` (at most 24: splits, the prompt tile's two forms, the chunk tiles, flash)


class StepGraph(CoopMatmul):
    """Records the step for one input set; `grids(T, R, positions)` gives the indirect grid of
    every dispatch."""

    def __init__(
        self,
        cfg: Gemma3Config,
        kernels: Kernels,
        weights: DeviceWeights,
        buffers: StepBuffers,
        k_pages: dict[int, Buffer],
        v_pages: dict[int, Buffer],
        inv_freq: dict[str, Buffer],
        kv_dtype: str,
        block_size: int,
        attention_chunk: int,
        grid_slots: DispatchGrids,
        profile: bool = False,
        coop_min_chunk: int | None = None,
        slot: int = 0,
        flash: bool = False,
        segment: tuple[int, int] | None = None,
    ) -> None:
        """`coop_min_chunk`: the cooperative-matrix path's shortest K chunk (coop_tiles.coop_chunks),
        None to run every matmul on matmul.comp. `slot`: which of the buffers' input sets
        this recording reads (the previous set's sampled ids feed its sourced tokens). `flash`:
        prompt tokens run attention_flash.comp (flash.py; needs the cooperative path). `segment`:
        the parts (first, last) of the path a pipeline stage runs (placement.py; None: all), from
        and to the buffers' hand-over (`_record`). `grid_slots`: where the indirect grids sit, one
        layout for all the recordings whose grids one count serves (every input set's, a stage's
        segments); a recording adds its grids as it is made (`command_buffer`), so a step's grids
        are counted after its recording is made."""
        self.cfg, self.kernels, self.w, self.b = cfg, kernels, weights, buffers
        self.inp, self.prev_ids = buffers.inputs[slot], buffers.inputs[slot - 1].ids
        self.attention_chunk = attention_chunk  # the smallest chunk span (attention.py)
        self.k_pages, self.v_pages, self.inv_freq = k_pages, v_pages, inv_freq
        self.kv_name = kv_dtype  # the suffix of the KV-page kernel variants
        self.block_size = block_size
        self.plan = CoopPlan(cfg, weights, coop_min_chunk)  # (holds coop_min_chunk)
        self.chunk_tile = chunk_tile_wanted()  # the chunk tile for prefill tiles' K chunks (coop_tiles)
        self.logits_in_tile = logits_in_tile_wanted()  # the LM head's direct tile writes the logits (graph_coop.py)
        self.grid_slots = grid_slots
        self.profile = profile
        self.segment = (0, 2 * cfg.num_layers + 1) if segment is None else segment
        self.stamps = Timestamps(kernels.dev, STAMPS_PER_LAYER * cfg.num_layers + 16)
        self.masks_ready = HostEvent(kernels.dev)  # reset for a step whose masks come while it runs
        heads_in_attention = any(self.plan.layer(layer).heads_in_attention for layer in range(cfg.num_layers)
                                 if self._runs(2 * layer + 1))
        self.modes = recording_modes(coop_min_chunk is not None, flash, heads_in_attention)  # recordings.py
        self._recorded: dict[str, tuple[object, list[str]]] = {}  # those made so far: each on its first step
        self.cb, self.stamped = None, []

    def command_buffer(self, num_tokens: int, num_seqs: int, prompt: bool = False):
        """The recording to submit for a step of `num_tokens` tokens of `num_seqs` sequences, with
        prompt tokens or none (`profile_timeline` then reads its timestamps). Each recording is made
        when a step first needs it: a job records the modes its steps use, not all (at 4b on the
        H200, about 0.1 s a recording; a 32-row job of long prompts uses two of the seven)."""
        mode = recording_for(num_tokens, num_seqs, prompt, self.modes, self.plan.decode_rows)
        if mode not in self._recorded:
            self.mode = mode.removesuffix(FLASH)  # which one `_record` is recording
            self.flash = mode.endswith(FLASH)
            self.cb = self.kernels.dev.command_buffer()
            self.stamped = []  # the kernel before each timestamp after the first
            self._record()
            self._recorded[mode] = (self.cb, self.stamped)
        self.cb, self.stamped = self._recorded[mode]
        return self.cb

    def grids(self, num_tokens: int, num_rows: int, positions: np.ndarray, flash_tiles: int = 0,
              prompt_start: int | None = None) -> np.ndarray:
        """The indirect grids of a step of T tokens and R logits rows, whose tokens on attention.comp
        are at `positions`, with `flash_tiles` tiles on attention_flash.comp and its tokens from
        `prompt_start` on (None: none) on the prompt tile (grids.py)."""
        return self.grid_slots.counts(num_tokens, num_rows, positions, flash_tiles, prompt_start)

    def _runs(self, part: int) -> bool:
        """Whether part `part` of the path (placement.py) is in this recording's segment."""
        return self.segment[0] <= part <= self.segment[1]

    def _dispatch(self, name: str, buffers: dict[int, Buffer], push: dict, grid: tuple[str, int],
                  specialize: bool = False) -> None:
        dset = self.kernels.descriptor_set({META_BINDING: self.inp.meta, **buffers}, self.b.dummy)
        self.kernels.record(self.cb, name, dset, push, self.inp.grids, self.grid_slots.offset(*grid), specialize)
        if self.profile:
            self._stamp(name)

    def _stamp(self, name: str) -> None:
        self.stamped.append(name)
        self.stamps.write(self.cb, len(self.stamped))

    def profile_timeline(self) -> list[tuple[str, float]]:
        """GPU seconds of each dispatch of the last replay, in recorded order (with `profile`; else
        one ("step", seconds)), from its first timestamp to its last."""
        return [(name, float(sec)) for name, sec in zip(self.stamped, self.stamps.seconds(len(self.stamped) + 1))]

    def _matmul(self, kind: str, layer: int, key: str, x: Buffer, y: Buffer, N: int, K: int,
                norm: Buffer | None = None, extra: dict[int, Buffer] | None = None,
                presplit: bool = False, split_next: dict[int, Buffer] | None = None, reduce_chunks: bool = True) -> None:
        """y = x . W[layer][key]^T with the variant `kind` (variants.MATMUL_KINDS); `norm` is the
        fused input RMSNorm weight, `extra` the variant's other buffers by binding. On the
        cooperative path only: `presplit`, the previous reduce wrote this input's split;
        `split_next`, this reduce writes the next matmul's (its norm weight at binding 3, if any);
        not `reduce_chunks`, no reduce: the next dispatch sums the K chunks itself (attention's QK_IN)."""
        dtype = self.w.dtype(layer, key)
        if self.plan.on_coop(layer, key, N, K):
            self._coop_matmul(kind, layer, key, dtype, x, y, N, K, norm, extra, presplit, split_next, reduce_chunks)
            return
        assert not presplit and split_next is None and reduce_chunks, "fusion needs the matmuls on the cooperative path"
        buffers = {0: self.w.buffer(layer, key), 1: x, 2: y, 6: self.b.counters, **(extra or {})}
        if norm is not None:
            buffers[3] = norm
        cfg = self.cfg
        push = {"N": N, "K": K, "eps": cfg.rms_norm_eps, "num_heads": cfg.num_heads,
                "num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "group": self.w.group(layer, key)}
        self._dispatch(matmul_variant(kind, dtype), buffers, push,
                       ("matmul_rows" if kind == "norm_rows" else "matmul_tokens", -(-N // matmul_cols(kind))))

    def _record(self) -> None:
        cfg, b, inp, w = self.cfg, self.b, self.inp, self.w
        H, I = cfg.hidden_size, cfg.intermediate_size
        self.kernels.begin_step(self.cb)  # (after the shader writes of a step submitted before it)
        self.stamps.reset(self.cb)
        self.stamps.write(self.cb, 0)
        self.kernels.zero(self.cb, [b.counters, b.attn_counters, b.row_sync])
        if self._runs(0):
            self._dispatch(f"embed_{w.dtype(-1, 'embed').lower()}",
                           {0: w.buffer(-1, "embed"), 1: inp.tokens, 2: b.x, 3: self.prev_ids},
                           {"H": H, "scale": cfg.embed_scale, "V": cfg.vocab_size}, ("tokens", 1))
        else:  # a pipeline stage: x = the stream handed over, copied as rows 0..T-1 of a table
            self._dispatch("embed_f32", {0: inp.x_in, 1: inp.row_ids, 2: b.x, 3: self.prev_ids},
                           {"H": H, "scale": 1.0, "V": 0}, ("tokens", 1))
        groups = {layer: g for g in cfg.kv_groups() for layer in g.layers}
        qkv_presplit = False  # the last post-norm reduce wrote qkv's split (reduce.comp SPLIT_NEXT)
        for layer in range(cfg.num_layers):
            lw, group = w.layers[layer], groups[layer]
            attends, feeds = self._runs(2 * layer + 1), self._runs(2 * layer + 2)
            if not (attends or feeds):
                continue
            fuse = self.plan.layer(layer)
            # (fusions across parts only where this recording runs both: a stage's edges hand x over)
            split_next = feeds and fuse.split_next_qkv and self._runs(2 * layer + 3)
            if attends:
                self._attention(layer, lw, group, fuse, qkv_presplit, split_gate=fuse.split_gate and feeds)
            if feeds:
                self._matmul("norm_gated", layer, "gate_proj", b.x, b.act, I, H, lw["pre_feedforward_layernorm"],
                             {4: w.buffer(layer, "up_proj")}, presplit=fuse.split_gate and attends,
                             split_next={} if fuse.split_down else None)
                self._matmul("post_norm", layer, "down_proj", b.act, b.y, H, I,
                             extra={9: lw["post_feedforward_layernorm"], 10: b.x}, presplit=fuse.split_down,
                             split_next={3: w.layers[layer + 1]["input_layernorm"]} if split_next else None)
            qkv_presplit = split_next
        if self._runs(2 * cfg.num_layers + 1):
            self._matmul("norm_rows", -1, "lm_head", b.x, b.logits, cfg.vocab_size, H, w.buffer(-1, "norm"), {5: inp.rows})
            self._dispatch("row_scores", {0: b.logits, 1: inp.score_rows, 2: inp.score_ids, 3: inp.scores},
                           {"row_stride": cfg.vocab_size}, ("rows", 1))
            self.kernels.wait_host(self.cb, self.masks_ready.handle)
            self._dispatch("sample", {0: b.logits, 1: inp.params, 2: inp.ids, 3: inp.masks}, {"row_stride": cfg.vocab_size},
                           ("rows", 1))
        else:  # hand the stream on: x_out = x, the same copy
            self._dispatch("embed_f32", {0: b.x, 1: inp.row_ids, 2: inp.x_out, 3: self.prev_ids},
                           {"H": H, "scale": 1.0, "V": 0}, ("tokens", 1))
        if not self.profile:
            self._stamp("step")
        self.kernels.end_step(self.cb)

    def _attention(self, layer: int, lw: dict, group, fuse, qkv_presplit: bool, split_gate: bool) -> None:
        """A layer's attention block (the module doc): qkv, attention (and flash), o; `split_gate`:
        o's reduce writes gate/up's split."""
        cfg, b, inp, H = self.cfg, self.b, self.inp, self.cfg.hidden_size
        qkv_n = cfg.q_width + 2 * cfg.kv_width
        # decode steps: attention sums qkv's chunks and runs the QK-norm, RoPE and KV store itself,
        # its sizes specialised in (push_constants.SPECIALIZED; docs/EXPERIMENTS.md, "Code size")
        qk_in = self.mode in DECODE_MODES and fuse.heads_in_attention
        self._matmul(f"norm_qk_rope_{self.kv_name}", layer, "qkv", b.x, b.qkv, qkv_n, H,
                     lw["input_layernorm"], {9: lw["qk_norm"], 10: b.q, 11: inp.positions, 12: self.inv_freq[group.name],
                                             13: inp.slots[group.name], 14: self.k_pages[layer], 15: self.v_pages[layer]},
                     presplit=qkv_presplit, reduce_chunks=not qk_in)
        width = dict(b.capacity.widths)[group.name]
        split_o = fuse.split_o and not self.flash  # attention writes o's split itself (not beside the flash kernel)
        heads = {0: b.partial, 13: lw["qk_norm"], 14: self.inv_freq[group.name], 15: inp.slots[group.name]} if qk_in else {0: b.q}
        self._dispatch(f"attention_{self.kv_name}{'_split' if split_o else ''}{'_qk' if qk_in else ''}",
                       {**heads, 1: b.attn, 2: inp.positions, 3: inp.token_seq, 4: inp.tables[group.name],
                        5: b.part_acc, 6: self.k_pages[layer], 8: self.v_pages[layer], 9: b.part_ml,
                        10: b.attn_counters, **({11: b.split, 12: b.split_scale} if split_o else {})},
                       {"num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
                        "window": group.window or 0, "block_size": self.block_size, "table_stride": width,
                        "chunk": self.attention_chunk, "scale": cfg.attn_scale,
                        "qkv_chunks": coop_chunks(qkv_n, H, self.plan.coop_min_chunk) if qk_in else 0,
                        "eps": cfg.rms_norm_eps},
                       (f"attention {group.name}", cfg.num_kv_heads), specialize=qk_in)
        if self.flash:
            self._dispatch(f"attention_flash_{self.kv_name}",
                           {0: b.q, 1: b.attn, 2: inp.positions, 3: inp.flash_tiles, 4: inp.tables[group.name],
                            6: self.k_pages[layer], 8: self.v_pages[layer]},
                           {"num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
                            "window": group.window or 0, "block_size": self.block_size, "table_stride": width,
                            "scale": cfg.attn_scale}, ("flash", cfg.num_kv_heads), specialize=True)
        self._matmul("post_norm", layer, "o_proj", b.attn, b.y, H, cfg.q_width,
                     extra={9: lw["post_attention_layernorm"], 10: b.x}, presplit=split_o,
                     split_next={3: lw["pre_feedforward_layernorm"]} if split_gate else None)

    def free(self) -> None:
        self.stamps.free()
        self.masks_ready.free()
        for cb, _ in self._recorded.values():
            self.kernels.vk.vkFreeCommandBuffers(self.kernels.dev.device, self.kernels.dev.command_pool, 1, [cb])


def kernel_seconds(timeline: list[tuple[str, float]]) -> dict[str, float]:
    """A `profile_timeline` summed per kernel name, in the order each first ran."""
    out: dict[str, float] = {}
    for name, sec in timeline:
        out[name] = out.get(name, 0.0) + sec
    return out
