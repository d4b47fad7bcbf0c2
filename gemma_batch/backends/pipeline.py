"""One model run across several devices: a backend whose steps pass through one stage backend per
device of a placement plan (`placement.py`).

    backend = PipelineBackend(cfg, placement, stages, layout, weights)
    backend.load_weights(tensors)     # each tensor to the stage(s) holding its part
    backend.allocate_kv(blocks, 16)   # each stage: pages for its own layers only
    result = backend.step(batch)      # the plan's segments in order

A step runs the plan's segments (`Placement.segments`) in order: the first from the token ids,
each next one from the residual stream the one before handed over ([T, H] float32, the step's
token layout), the last through the LM head and the sampler. So the activations cross once per
boundary per step, T * H * 4 bytes each (`crossing_bytes`). The engine sees one backend with
one block table: block b names the same slots on every stage, each holding there the K/V of its
own layers. Steps run in order on the pipeline's own thread, so that the engine builds the next
step while one runs (`submit`); each stage's arithmetic is fixed by the plan, so a row's output
does not depend on its batch.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from ..model.checkpoint import Tensor
from ..model.config import Gemma3Config
from ..model.quant import QuantizedTensor, WeightFormat
from ..model.conversion import converted_nbytes_by_dtype
from .base import Backend, StepBatch, StepResult
from .placement import ACTIVATION_BYTES, Placement, held_tensors


class PipelineBackend(Backend):
    """The stages (one backend per device of `placement`, each built with its segments) as one
    backend. `layout` (tensor name -> stored dtype and shape) and `weights` (the run's format)
    size each stage's share of the weights before they are loaded."""

    name = "pipeline"
    overlaps = True  # steps run on the pipeline's own thread (`submit`)

    def __init__(self, cfg: Gemma3Config, placement: Placement, stages: Mapping[str, Backend],
                 layout: Mapping[str, tuple[str, tuple[int, ...]]], weights: WeightFormat) -> None:
        super().__init__(cfg)
        self.placement, self.stages = placement, dict(stages)
        self.order: list[tuple[str, int]] = []  # (device, index among its stage's segments) per segment
        for segment in placement.segments():
            self.order.append((segment.device, sum(d == segment.device for d, _ in self.order)))
        self.held = {d: held_tensors(layout, s.segments, cfg.num_layers, cfg.tie_word_embeddings) for d, s in self.stages.items()}
        self.stage_weight_bytes = {d: s.weight_bytes(converted_nbytes_by_dtype({n: layout[n] for n in self.held[d]}, weights))
                                   for d, s in self.stages.items()}
        self.kv_dtype = "/".join(dict.fromkeys(s.kv_dtype for s in self.stages.values()))
        self.weight_formats = (weights.name,)  # (each stage was built for it)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="gemma-batch-pipeline")
        self._running: deque[tuple[Future, threading.Event, StepBatch]] = deque()  # submitted, not waited for
        self._thread_ids: np.ndarray | None = None  # the ids the thread's last step sampled
        self._device_seconds: float | None = None

    @property
    def identity(self) -> str:
        return f"pipeline ({self.placement.describe()}): " + "; ".join(f"{d}: {s.identity}" for d, s in self.stages.items())

    def load_weights(self, tensors: Iterable[tuple[str, Tensor | QuantizedTensor]]) -> None:
        """Every stage loads at once, on its own thread, from a queue of the tensors it holds (a
        few at a time: the checkpoint is read once, and never held whole). The first error, a
        stage's or the checkpoint's, is raised once every stage has stopped."""
        feeds = {d: queue.Queue(maxsize=2) for d in self.stages}
        failed: list[BaseException] = []
        held = {d: set(names) for d, names in self.held.items()}

        def load(device: str) -> None:
            def items() -> Iterator[tuple[str, Tensor | QuantizedTensor]]:
                while (item := feeds[device].get()) is not None:
                    yield item
            try:
                self.stages[device].load_weights(items())
            except BaseException as e:  # noqa: BLE001 (raised by the caller below)
                failed.append(e)

        threads = {d: threading.Thread(target=load, args=(d,), name=f"load {d}", daemon=True) for d in self.stages}
        for thread in threads.values():
            thread.start()

        def put(device: str, item: object) -> None:
            while threads[device].is_alive():  # (a stage that stopped takes nothing more)
                try:
                    feeds[device].put(item, timeout=0.1)
                    return
                except queue.Full:
                    continue

        try:
            for name, tensor in tensors:
                if failed:
                    break
                for device in self.stages:
                    if name in held[device]:
                        put(device, (name, tensor))
        finally:  # the end of every stage's tensors (a stage given too few says which are missing)
            for device in self.stages:
                put(device, None)
            for thread in threads.values():
                thread.join()
        if failed:
            raise failed[0]

    def close(self) -> None:
        for stage in self.stages.values():
            stage.close()

    def weight_bytes(self, tensor_bytes: Mapping[str, int]) -> int:
        """The stages' shares, from the layout given at construction (the whole model's bytes by
        dtype, the argument, do not say where each tensor goes)."""
        return sum(self.stage_weight_bytes.values())

    def _kv_token_bytes(self, device: str) -> int:
        return sum(self.stages[device].kv_bytes_per_token(g.name) for g in self.cfg.kv_groups())

    def available_memory(self) -> int:
        """The weights, plus the KV memory the tightest stage allows: a block takes memory on every
        stage holding layers of its group, so a stage with a share k of each token's KV bytes and
        f bytes free beside its weights bounds the whole cache to f / k."""
        total = sum(self._kv_token_bytes(d) for d in self.stages)
        room = []
        for device, stage in self.stages.items():
            free = stage.available_memory() - self.stage_weight_bytes[device]
            share = self._kv_token_bytes(device) / total if total else 0.0
            room.append(free if free <= 0 else free / share if share else None)
        bound = min((r for r in room if r is not None), default=0)
        return sum(self.stage_weight_bytes.values()) + int(bound)

    def stage_memory(self) -> dict[str, tuple[int, int]]:
        """Per stage: bytes of the weights it will hold, and bytes free there (the job's log)."""
        return {d: (self.stage_weight_bytes[d], s.available_memory()) for d, s in self.stages.items()}

    def kv_bytes_per_token(self, group: str) -> int:
        return sum(s.kv_bytes_per_token(group) for s in self.stages.values())

    def max_kv_blocks(self, group: str, block_size: int) -> int | None:
        limits = [s.max_kv_blocks(group, block_size) for s in self.stages.values()]
        return min((n for n in limits if n is not None), default=None)

    def allocate_kv(self, num_blocks: Mapping[str, int], block_size: int) -> None:
        while self._running:  # an engine left steps running (it stopped early): nobody will take them
            self.discard()
        for stage in self.stages.values():
            stage.allocate_kv(num_blocks, block_size)

    def reserve(self, max_tokens: int, max_seqs: int, max_blocks: Mapping[str, int]) -> None:
        for stage in self.stages.values():
            stage.reserve(max_tokens, max_seqs, max_blocks)

    @property
    def default_step_tokens(self) -> int:
        """The longest any stage wants: a GPU's products and the CPU's widening of quantized
        matrices both gain from long steps (`max_step_tokens` still bounds each stage)."""
        return max(s.default_step_tokens for s in self.stages.values())

    def max_step_tokens(self, max_seqs: int, max_blocks: Mapping[str, int]) -> int | None:
        limits = [s.max_step_tokens(max_seqs, max_blocks) for s in self.stages.values()]
        return min((n for n in limits if n is not None), default=None)

    @property
    def small_step(self) -> int | None:
        steps = [s.small_step for s in self.stages.values()]
        return None if None in steps else min(steps)

    def last_step_device_seconds(self) -> float | None:
        """The stages' device time in the last step `wait` returned, where every stage has one
        (GPUs); the rest of a step's time is the host's, the hand-overs included."""
        return self._device_seconds

    def peak_memory(self) -> int:
        return sum(s.peak_memory() for s in self.stages.values())

    def measure_read_bandwidth(self, nbytes: int) -> float:
        """The rate of reading every stage's weights in turn: the stages' bandwidths weighted by
        their weights (what bounds a decode step)."""
        seconds = sum(w / self.stages[d].measure_read_bandwidth(nbytes) for d, w in self.stage_weight_bytes.items())
        return sum(self.stage_weight_bytes.values()) / seconds

    def crossing_bytes(self, num_tokens: int) -> int:
        """Bytes of activations a step of `num_tokens` tokens hands over between devices."""
        return (len(self.order) - 1) * num_tokens * self.cfg.hidden_size * ACTIVATION_BYTES

    def submit(self, batch: StepBatch) -> None:
        """Queue the step for the pipeline's thread, which runs steps in order, each segment after
        the one before (the engine builds the next step meanwhile)."""
        if len(self._running) >= self.MAX_IN_FLIGHT:
            raise RuntimeError(f"{self.MAX_IN_FLIGHT} steps are already in flight")
        masks = threading.Event()  # set when the step's grammar masks are in (or it has none coming)
        if batch.sampling is None or not batch.sampling.masks_follow or batch.sampling.allowed is not None:
            masks.set()
        self._running.append((self._thread.submit(self._run, batch, masks), masks, batch))

    def allow(self, allowed: np.ndarray) -> None:
        """The masks of the step submitted last; its head waits for them."""
        if not self._running or self._running[-1][1].is_set():
            raise RuntimeError("allow() without a step submitted with masks_follow waiting for its masks")
        _, masks, batch = self._running[-1]
        batch.sampling.allowed = allowed  # (the object the thread's copy of the batch holds too)
        masks.set()

    def wait(self) -> StepResult:
        future, masks, _ = self._running.popleft()
        if not masks.is_set():  # (let the step end unmasked: nobody reads its draws)
            masks.set()
            future.result()
            raise RuntimeError("wait() before allow(): the step's grammar masks were never given")
        result, self._device_seconds = future.result()
        self._last_ids = result.token_ids
        return result

    def discard(self) -> None:
        future, masks, _ = self._running.popleft()
        masks.set()
        future.result()

    def step(self, batch: StepBatch) -> StepResult:
        if self._running:
            raise RuntimeError("step() with steps in flight: wait() for them first")
        self.submit(batch)
        return self.wait()

    def _run(self, batch: StepBatch, masks: threading.Event) -> tuple[StepResult, float | None]:
        """One step on the pipeline's thread: its sourced tokens from the step before, then the
        segments in order, the head's after the grammar masks are in."""
        batch = replace(batch, token_ids=batch.sourced_tokens(self._thread_ids), token_sources=None)
        x: np.ndarray | StepResult | None = None
        for k, (device, index) in enumerate(self.order):
            last = k == len(self.order) - 1
            if last:
                masks.wait()
            out = None if last else self.stages[self.order[k + 1][0]].stream_in(batch)  # (written in place)
            x = self.stages[device].run_segment(index, batch, x, out)
        assert isinstance(x, StepResult), "the plan's last segment ends with the head"
        self._thread_ids = x.token_ids
        times = [s.last_step_device_seconds() for s in self.stages.values()]
        return x, None if None in times else sum(times)
