"""The Vulkan backend: the Gemma 3 step as compute shaders on any Vulkan device.

    backend = VulkanBackend(cfg)                 # device chosen as in `device.py`
    backend.load_weights(checkpoint.tensors())   # uploaded once, resident for the job
    backend.allocate_kv(num_blocks, block_size)  # one K and one V page buffer per layer (`kv_pages.py`)
    result = backend.step(batch)                 # only token ids come back

Per step the host writes the step's inputs into mapped buffers and submits the command buffer
recorded once (`graph.py`) (`submit`); then it waits for the device and reads R sampled ids
(`wait`). Sets of step inputs, one per step in flight (MAX_IN_FLIGHT), take turns, and each step
reads the tokens the one before it samples on the device: the GPU need not wait for the host.
Numerics: weights as stored (bf16/fp16/fp32, widened exactly) or int8 / int4 (dequantized in
registers, `weights.py`); residual stream and every reduction in fp32; KV pages fp16 (default),
bf16, fp32 or int8 (`--kv-dtype`: rounded as `kv_formats.py` defines, laid out as
`shaders/kv_pages.glsl` says, widened in registers).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ...model.checkpoint import Tensor
from ...model.config import Gemma3Config
from ...model.quant_cache import cache_root
from ...model.quant import FORMATS
from ...startup import phase
from ..base import Backend, StepBatch, StepResult
from ..cpu_math import rope_inv_freq
from ..kv_formats import kv_label, kv_token_bytes
from ..placement import Segment
from .attention import DEFAULT_CHUNK
from .bandwidth import measure_read_bandwidth
from . import coop_tiles, coopmat, flash, fragment_order, tuning
from .device import Device
from .graph import StepGraph, kernel_seconds
from .in_flight import InFlight, StepRows, read_result, step_rows, write_step
from .kernels import Kernels
from .kv_pages import allocate_pages, max_page_blocks, page_sizes
from .memory import Memory
from .step_buffers import PREFILL_STEP_TOKENS, ROWS_PER_SEQ, STEP_MEMORY_SHARE, Capacity, StepBuffers, fitting_step_tokens
from .step_graphs import KV_VARIANTS, StepGraphs
from .supported import check_supported
from .weights import DeviceWeights

SCRATCH_RESERVE = 0.1  # share of free device memory left out of `available_memory` for step buffers


class VulkanBackend(StepGraphs, Backend):
    name = "vulkan"
    overlaps = True
    weight_formats = FORMATS
    default_kv_dtype = "fp16"

    def __init__(self, cfg: Gemma3Config, device: str | None = None, kv_dtype: str = default_kv_dtype,
                 profile: bool = False, attention_chunk: int = DEFAULT_CHUNK,
                 coop_min_chunk: int = coop_tiles.COOP_MIN_CHUNK, segments: Sequence[Segment] | None = None,
                 memory_limit: int | None = None) -> None:
        """`profile`: time every dispatch (`profile_seconds`), not only the whole step.
        `attention_chunk`: the smallest span of key positions one attention workgroup takes
        (`attention.py`; part of `identity` when not the default: it changes summation orders;
        tests make it small), `coop_min_chunk` likewise for the cooperative matmuls' K chunks.
        `segments`: the parts it runs as a pipeline stage (`run_segment`; weights and KV pages of
        those parts only). `memory_limit`: the most device memory it may plan to hold (None: what
        is free)."""
        super().__init__(cfg, segments)
        check_supported(cfg)
        if kv_dtype not in KV_VARIANTS:
            raise ValueError(f"KV dtype {kv_dtype!r}: the Vulkan backend has {', '.join(KV_VARIANTS)}")
        if attention_chunk < 1:
            raise ValueError(f"attention chunk {attention_chunk}: expected at least one key per chunk")
        self.kv_dtype = kv_dtype
        self.profile = profile
        self.attention_chunk = attention_chunk
        self.coop_min_chunk = coop_min_chunk
        with phase("device: Vulkan"):
            self.device = Device(device)
        self.mem = Memory(self.device, memory_limit)
        kernels = fragment_order.model_kernels(Kernels.for_model(self.device, cfg, coopmat.split_inputs(kv_dtype)), self.mem, cfg)
        self.kernels = tuning.tuned(kernels, self.mem, cfg, cache_root())  # the prompt tile's forms (tuning.py)
        self.weights = DeviceWeights(cfg, self.mem, tiles=self.device.coopmat, fragment_order=self.kernels.fragment_loads,
                                     segments=segments, kernels=self.kernels, int8_tiles=fragment_order.int8_tiles_wanted())
        self.small_step = coop_tiles.COOP_FOLD_ROWS if self.device.coopmat else None  # steps up to it run on the decode tiles
        self.flash = self.device.coopmat and flash.flash_fits(cfg, kv_dtype) and flash.wanted()  # prompt tokens' attention
        self.prompt_tile = self.device.coopmat and coop_tiles.prompt_tile_wanted()  # ... and products (coop_tiles)
        self.k_pages: dict = {}
        self.v_pages: dict = {}
        self.block_size = 0
        self.buffers: StepBuffers | None = None
        self.graphs: list[StepGraph] = []  # one per input set of `buffers`
        self._in_flight: deque[InFlight] = deque()  # submitted steps, oldest first
        self._next_slot = 0  # the input set the next step writes
        self._last_timeline: list[tuple[str, float]] = []  # GPU seconds a dispatch of the last step `wait` returned
        self.inv_freq = {  # the CPU reference's fp32 inv_freq, bit for bit
            name: self.mem.uploaded(rope_inv_freq(cfg.head_dim, spec).astype(np.float32), f"{name} RoPE frequencies")
            for name, spec in cfg.rope.items()}

    @property
    def identity(self) -> str:
        chunk = "" if self.attention_chunk == DEFAULT_CHUNK else f", attention chunk {self.attention_chunk}"
        if self.device.coopmat:
            chunk += ", cooperative matrices" + ("" if self.kernels.x_lo else " on fp16 inputs")
            chunk += ", flash attention" if self.flash else ""
            chunk += ", prompt tile" if self.prompt_tile else ""
            chunk += "" if self.coop_min_chunk == coop_tiles.COOP_MIN_CHUNK else f" (K chunks of {self.coop_min_chunk}+)"
        kv = kv_label(self.kv_dtype, self.cfg.head_dim)
        return f"vulkan on {self.device.info.name} ({self.device.info.driver}), KV {kv}{chunk}"

    def load_weights(self, tensors: Iterable[tuple[str, Tensor]]) -> None:
        self.weights.load(tensors)

    def available_memory(self) -> int:
        return int(self.mem.free_bytes() * (1 - SCRATCH_RESERVE))

    def kv_bytes_per_token(self, group: str) -> int:
        return kv_token_bytes(self.cfg, group, self.kv_dtype, self.kv_layers)

    def max_kv_blocks(self, group: str, block_size: int) -> int:
        """Each layer's K (and V) pages are one buffer, bounded by the device's largest buffer."""
        return max_page_blocks(self.cfg, self.kv_dtype, block_size, self.device.info.max_storage_buffer_range)

    def allocate_kv(self, num_blocks: Mapping[str, int], block_size: int) -> None:
        """Pages of the asked sizes. Pages of those sizes already there are kept, with the recorded
        steps (an engine writes every slot before reading it): recording again takes about 2 s at
        4b, with the GPU clocking down (docs/EXPERIMENTS.md, "A new engine on the same pages")."""
        while self._in_flight:  # an engine left steps running (it stopped early): nobody will take them
            self._finish(self._in_flight.popleft())
        sizes = page_sizes(self.cfg, self.kv_dtype, num_blocks, block_size, self.kv_layers)
        if block_size == self.block_size and all(sizes == {layer: page.size for layer, page in pages.items()}
                                                 for pages in (self.k_pages, self.v_pages)):
            return
        self._drop_graph()  # it points at the old pages
        for page in [*self.k_pages.values(), *self.v_pages.values()]:
            self.mem.free(page)
        self.k_pages, self.v_pages = allocate_pages(self.mem, self.cfg, sizes)
        self.block_size = block_size

    def reserve(self, max_tokens: int, max_seqs: int, max_blocks: Mapping[str, int]) -> None:
        """Size the step buffers for the whole run (a step that outgrows them waits while they are made
        again: EXPERIMENTS.md, "Steps recorded once per run"); logits rows for ROWS_PER_SEQ a sequence."""
        need = Capacity(max_tokens, max_seqs, ROWS_PER_SEQ * max_seqs, tuple(sorted(max_blocks.items())))
        if self._outgrown(need):
            self._ensure(need)

    @property
    def default_step_tokens(self) -> int:
        return PREFILL_STEP_TOKENS if self.device.coopmat else super().default_step_tokens

    def max_step_tokens(self, max_seqs: int, max_blocks: Mapping[str, int]) -> int | None:
        """The largest step whose buffers each fit the device's largest storage buffer and
        together STEP_MEMORY_SHARE of the memory the KV pages left."""
        coop = self.coop_min_chunk if self.device.coopmat else None
        held = 0 if self.buffers is None else self.buffers.device_bytes()  # (given back before larger ones are made)
        total = int(STEP_MEMORY_SHARE * (self.mem.free_bytes() + held))
        return fitting_step_tokens(self.cfg, self.device.info.max_storage_buffer_range, max_seqs, max_blocks,
                                   self.block_size, self.attention_chunk, coop, self.device.info.sm_count, total)

    def step(self, batch: StepBatch) -> StepResult:
        if self._in_flight:
            raise RuntimeError("step() with steps in flight: wait() for them first")
        self.submit(batch)
        return self.wait()

    def submit(self, batch: StepBatch) -> None:
        """Write the step's inputs into the free input set and start it; `wait` reads its sampled
        ids. With the step before still running, this one's sourced tokens are read on the device
        from that step's ids (embed.comp), and the queue runs it right after (graph.py's barrier)."""
        if len(self._in_flight) >= self.MAX_IN_FLIGHT:
            raise RuntimeError(f"{self.MAX_IN_FLIGHT} steps are already in flight")
        if self._in_flight and self._in_flight[-1].masks_due:
            raise RuntimeError("submit() before allow(): the step before waits for its grammar masks")
        layout = step_rows(batch)
        grows = self._outgrown(layout.capacity)
        before = self._in_flight[-1] if self._in_flight else None
        if grows or any(step.batch.return_logits or step.batch.logit_rows is not None for step in self._in_flight):
            for step in self._in_flight:  # their ids (and logits: one buffer for every set) must be read first
                self._finish(step)
        if before is not None and before.result is None:  # still running: -1 - its ids row, for embed.comp
            token_ids = batch.sourced_tokens(-1 - before.id_rows)
        else:
            token_ids = batch.sourced_tokens(self._last_ids if before is None else before.result.token_ids)
        if grows:
            self._ensure(layout.capacity)
        slot = self._next_slot
        self._next_slot = (slot + 1) % self.MAX_IN_FLIGHT
        recording = self.graphs[slot].command_buffer(batch.num_tokens, batch.num_seqs, bool(batch.prompt_mask().any()))
        step = self._write_step(batch, token_ids, layout, slot)  # (its grids counted once its recording is made)
        if step.masks_due:
            self.graphs[slot].masks_ready.reset()
        self.device.submit(recording, slot)
        self._in_flight.append(step)

    def _write_step(self, batch: StepBatch, token_ids: np.ndarray, layout: StepRows, slot: int) -> InFlight:
        return write_step(batch, token_ids, layout, slot, self.buffers.inputs[slot], self.cfg, self.graphs[0].grids,
                          self.flash, self.prompt_tile)

    def allow(self, allowed: np.ndarray) -> None:
        """The masks go into the step's input set, and the step, held before its sampler since
        `submit` (StepGraph.masks_ready), goes on."""
        step = self._in_flight[-1] if self._in_flight else None
        if step is None or not step.masks_due:
            raise RuntimeError("allow() without a step submitted with masks_follow waiting for its masks")
        step.batch.sampling.allowed = allowed
        self.buffers.inputs[step.slot].write_masks(allowed, step.batch.sample, step.id_rows)
        self.graphs[step.slot].masks_ready.set()
        step.masks_due = False

    def wait(self) -> StepResult:
        if self._in_flight and self._in_flight[0].masks_due:
            self.discard()
            raise RuntimeError("wait() before allow(): the step's grammar masks were never given")
        step = self._finish(self._in_flight.popleft())
        self._last_ids, self._last_timeline = step.result.token_ids, step.timeline
        return step.result

    def discard(self) -> None:
        self._finish(self._in_flight.popleft())  # the device is done with its input set

    def _finish(self, step: InFlight) -> InFlight:
        """Wait for `step` (the oldest in flight) and read its results and timestamps, once."""
        if step.result is not None:
            return step
        if step.masks_due:  # never given (the engine stopped): let the step end; nobody reads its draws
            self.graphs[step.slot].masks_ready.set()
            step.masks_due = False
        self.device.wait(step.slot)
        step.result = read_result(step, self.buffers.inputs[step.slot], self._logits)
        step.timeline = self.graphs[step.slot].profile_timeline()  # one read of the timestamps: per dispatch, or "step"
        return step

    def _logits(self, first: int, n: int) -> np.ndarray:
        """Rows first..first+n-1 of the last step's logits [n, V]."""
        V = self.cfg.vocab_size
        return self.mem.download(self.buffers.logits, 4 * n * V, 4 * first * V).view(np.float32).reshape(n, V)

    def last_step_device_seconds(self) -> float | None:
        return sum(seconds for _, seconds in self._last_timeline) if self._last_timeline else None

    def profile_seconds(self) -> dict[str, float]:
        """GPU seconds of the last step `wait` returned, per kernel (all in "step" unless built
        with `profile`)."""
        return kernel_seconds(self._last_timeline)

    def profile_timeline(self) -> list[tuple[str, float]]:
        """GPU seconds of each dispatch of the last step `wait` returned, in order (one "step"
        unless built with `profile`)."""
        return list(self._last_timeline)

    def peak_memory(self) -> int:
        return self.mem.peak

    def measure_read_bandwidth(self, nbytes: int) -> float:
        return measure_read_bandwidth(self.kernels, self.mem, nbytes)

    def close(self) -> None:
        """Release every device resource (also done at interpreter exit by the driver)."""
        if self.device.device is None:
            return
        self._drop_graph()
        self.kernels.close()
        self.mem.close()
        self.device.close()
