"""A pipeline stage on a Vulkan device (`backends/pipeline.py`): the Vulkan backend running only
the segments of a placement plan that fall on its device.

It holds the weights and KV pages of its segments' parts only (weights.py, kv_pages.py), and
records each segment on its own (graph.py `segment`: from the stream handed in, to the stream
handed on, no fusion across its edges). A step's inputs go into its one input set at the
step's first segment here; each segment then runs to its end before `run_segment` returns.
The GPU hands the stream on by writing it into cached host memory (StepInputs `x_out`), which a
CPU stage reads in place; it reads the stream handed in from host-visible memory (`x_in`,
`stream_in`), which a CPU stage writes in place. Between two GPUs the host copies x_out into
the next one's x_in: the one copy of a crossing (import of one host buffer by both,
VK_EXT_external_memory_host, would leave it out: docs/PERFORMANCE.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...model.config import Gemma3Config
from ..base import StepBatch, StepResult
from ..placement import Segment
from .backend import VulkanBackend
from .grids import DispatchGrids
from .in_flight import read_result, step_rows
from .step_buffers import Capacity, StepBuffers


class VulkanStage(VulkanBackend):
    def __init__(self, cfg: Gemma3Config, segments: Sequence[Segment], **options) -> None:
        """`options`: VulkanBackend's."""
        super().__init__(cfg, segments=segments, **options)
        self._batch: StepBatch | None = None  # the step whose inputs the input set holds

    def submit(self, batch: StepBatch) -> None:
        raise RuntimeError("a pipeline stage runs segments of steps (run_segment), not whole steps")

    def _build(self, capacity: Capacity, coop: int | None) -> None:
        """One input set with the hand-over buffers, a recording per segment, and one set of grid
        slots for them all (the set's grids serve each)."""
        self.buffers = StepBuffers(self.cfg, self.mem, capacity, self.block_size, self.attention_chunk, coop,
                                   sets=1, sm_count=self.device.info.sm_count, crossing=True)
        slots = DispatchGrids(self.cfg, self.attention_chunk, self.device.info.sm_count)
        self.graphs = [self._graph(coop, 0, slots, segment=(s.first, s.last)) for s in self.segments]

    def stream_in(self, batch: StepBatch) -> np.ndarray:
        """The input set's x_in, [T, H] (its step buffers first grown to the batch: `_prepare`)."""
        self._prepare(batch)
        return StepBuffers.view(self.buffers.inputs[0].x_in, np.float32, batch.num_tokens * self.cfg.hidden_size).reshape(
            batch.num_tokens, -1)

    def _prepare(self, batch: StepBatch) -> None:
        """At the step's first call here: the step buffers grown to it (no segment of the step has
        run here yet), and its inputs written."""
        if self._batch is not batch:
            layout = step_rows(batch)
            if self._outgrown(layout.capacity):
                self._ensure(layout.capacity)
            self._prompt = bool(batch.prompt_mask().any())
            for graph in self.graphs:  # (their recordings made before the step's grids are counted: graph.py)
                graph.command_buffer(batch.num_tokens, batch.num_seqs, self._prompt)
            self._step = self._write_step(batch, batch.token_ids, layout, 0)
            self._batch, self._last_timeline = batch, []

    def run_segment(self, index: int, batch: StepBatch, x: np.ndarray | None,
                    out: np.ndarray | None = None) -> np.ndarray | StepResult:
        self._prepare(batch)
        T, inputs, graph = batch.num_tokens, self.buffers.inputs[0], self.graphs[index]
        head = self.segments[index].last == 2 * self.cfg.num_layers + 1
        if head and batch.sampling is not None and batch.sampling.allowed is not None:  # (masks: in by now, pipeline.py)
            inputs.write_masks(batch.sampling.allowed, batch.sample, self._step.id_rows)
        x_in = StepBuffers.view(inputs.x_in, np.float32, T * self.cfg.hidden_size)
        if x is not None and not np.shares_memory(x, x_in):  # (a stage before that wrote it in place: no copy)
            x_in[:] = x.reshape(-1)
        self.device.submit(graph.command_buffer(T, batch.num_seqs, self._prompt), 0)
        self.device.wait(0)
        self._last_timeline += graph.profile_timeline()  # (the step's device time: its segments')
        if not head:
            x_out = StepBuffers.view(inputs.x_out, np.float32, T * self.cfg.hidden_size).reshape(T, -1)
            if out is None:
                return x_out
            out[:] = x_out  # (another GPU's x_in: the one host copy of a crossing between GPUs)
            return out
        self._batch = None
        return read_result(self._step, inputs, self._logits)
