"""The step buffers and their recorded graphs (graph.py), a part of `VulkanBackend`: made for a
capacity of step (an input set and a graph per step in flight, one layout of grids), grown when a
step outgrows them, freed before the pages they point at change. `VulkanStage` builds its own
(`_build`: one input set, a graph per segment)."""

from __future__ import annotations

from .graph import StepGraph
from .grids import DispatchGrids
from .step_buffers import Capacity, StepBuffers, first_capacity

# --kv-dtype -> suffix of the KV-page kernel variants (variants.KV_DEFINES)
KV_VARIANTS = {"fp16": "float16", "fp32": "float32", "bf16": "bfloat16", "int8": "int8"}


class StepGraphs:
    """`VulkanBackend`'s step buffers (`buffers`) and graphs (`graphs`); it provides `cfg`, `mem`,
    `device`, `kernels`, `weights`, the pages, `block_size`, `attention_chunk`, `coop_min_chunk`,
    `flash`, `profile`, the steps in flight and `_finish`."""

    def _outgrown(self, need: Capacity) -> bool:
        """Whether a step of `need` does not fit the step buffers (or there are none yet)."""
        return self.buffers is None or not self.buffers.capacity.covers(need)

    def _ensure(self, need: Capacity) -> None:
        """Grow the step buffers (and record the graphs again) for a step that does not fit (no
        step may be running: `submit` finishes the one before first)."""
        if not self.block_size:
            raise RuntimeError("allocate_kv must be called before step")
        capacity = (self.buffers.capacity if self.buffers is not None else first_capacity(need.widths)).grown_to(need)
        self._drop_graph()
        self._build(capacity, self.coop_min_chunk if self.device.coopmat else None)

    def _build(self, capacity: Capacity, coop: int | None) -> None:
        """The step buffers: an input set and a graph per step in flight, one layout of grids (graph.py)."""
        self.buffers = StepBuffers(self.cfg, self.mem, capacity, self.block_size, self.attention_chunk, coop,
                                   sets=self.MAX_IN_FLIGHT, sm_count=self.device.info.sm_count)
        grids = DispatchGrids(self.cfg, self.attention_chunk, self.device.info.sm_count)
        self.graphs = [self._graph(coop, slot, grids) for slot in range(self.MAX_IN_FLIGHT)]

    def _graph(self, coop: int | None, slot: int, grid_slots: DispatchGrids, **options) -> StepGraph:
        """The recordings of input set `slot` (`options`: StepGraph's segment)."""
        return StepGraph(self.cfg, self.kernels, self.weights, self.buffers, self.k_pages, self.v_pages, self.inv_freq,
                         KV_VARIANTS[self.kv_dtype], self.block_size, self.attention_chunk, grid_slots, self.profile,
                         coop, slot, self.flash, **options)

    def _drop_graph(self) -> None:
        """Free the recorded steps and their buffers; the next step records them again."""
        if self.buffers is not None:
            for step in self._in_flight:  # (read before their buffers go; a held one released)
                self._finish(step)
            self.device.vk.vkDeviceWaitIdle(self.device.device)
            for graph in self.graphs:
                graph.free()
            self.buffers.free()
            self.kernels.reset_sets()
            self.graphs, self.buffers = [], None
