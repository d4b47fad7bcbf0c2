"""The contract between the engine and a backend: one call per step.

The engine decides *what* to compute (which tokens, which KV blocks); a backend decides *how*
(on which device, with which kernels) and owns the memory behind the block ids.

    backend.step(batch: StepBatch) -> StepResult

KV layout: the model declares KV groups (`Gemma3Config.kv_groups()`: the global layers, the
sliding-window layers). Each group has its own pool of `num_blocks` blocks of `block_size` token
slots, and every layer of the group stores a token's K/V at the same slot
`block_id * block_size + position % block_size`. Block table entry `j` of a sequence holds the
block for positions `[j * block_size, (j + 1) * block_size)`; entries for blocks a sequence does
not hold (sliding-window blocks that left the window, padding) are -1 and are never read.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from ..model.checkpoint import Tensor
from ..model.config import Gemma3Config
from ..model.quant import QuantizedTensor
from .placement import Segment
from .step_data import NON_FINITE, SamplingBatch, StepBatch, StepResult

__all__ = ["NON_FINITE", "Backend", "SamplingBatch", "StepBatch", "StepResult"]


class Backend(ABC):
    """A device that runs Gemma 3 steps. Life cycle: construct, load weights, allocate KV, step."""

    name: str
    weight_formats: tuple[str, ...] = ("bf16",)  # the `--weights` formats `load_weights` accepts
    kv_dtype: str  # how the KV cache stores K and V (`kv_formats`)
    default_kv_dtype: str  # the KV dtype when a job names none

    def __init__(self, cfg: Gemma3Config, segments: Sequence[Segment] | None = None) -> None:
        """`segments`: the parts of the model this backend runs, as a stage of a pipeline over
        several devices (`run_segment`, `pipeline.py`); None: all of it, one `step` at a time."""
        self.cfg = cfg
        self.segments = None if segments is None else tuple(segments)
        # The layers whose attention (and KV cache) this backend holds.
        self.kv_layers = frozenset(range(cfg.num_layers)) if segments is None else frozenset(
            i for s in segments for i in s.layers(cfg.num_layers) if s.holds("attention", i, cfg.num_layers))
        self._submitted: deque[StepBatch] = deque()  # steps between `submit` and `wait`, oldest first
        self._last_ids: np.ndarray | None = None  # the sampled ids of the last step `wait` returned

    @property
    def identity(self) -> str:
        """What decides this backend's arithmetic (a resumed job must run on the same): its name,
        and for a device backend the device and storage choices."""
        return self.name

    @abstractmethod
    def load_weights(self, tensors: Iterable[tuple[str, Tensor | QuantizedTensor]]) -> None:
        """Take every text tensor, one at a time, by canonical name (see `model.weights`), in one
        of `weight_formats` (`model.quant_cache.load_converted` converts a checkpoint's)."""

    @abstractmethod
    def available_memory(self) -> int:
        """Bytes the device could still give to the KV cache (free memory, before any budget)."""

    def weight_bytes(self, tensor_bytes: Mapping[str, int]) -> int:
        """Memory the weights will take once loaded, from the checkpoint's stored bytes per dtype
        (so that the KV cache can be planned before the weights are loaded). Default: as stored."""
        return sum(tensor_bytes.values())

    def max_kv_blocks(self, group: str, block_size: int) -> int | None:
        """Most blocks one KV group's pool can have (a device's largest buffer), or None: no limit."""
        return None

    @abstractmethod
    def kv_bytes_per_token(self, group: str) -> int:
        """Bytes one token slot of KV group `group` takes, summed over the group's layers."""

    @abstractmethod
    def allocate_kv(self, num_blocks: Mapping[str, int], block_size: int) -> None:
        """Allocate `num_blocks[group]` KV blocks of `block_size` token slots for each KV group."""

    def reserve(self, max_tokens: int, max_seqs: int, max_blocks: Mapping[str, int]) -> None:
        """Make room now for every step of up to `max_tokens` tokens of up to `max_seqs` sampled
        sequences whose block tables hold up to `max_blocks[group]` entries (after `allocate_kv`),
        so that no such step has to wait for it mid-run. Default: nothing to do."""

    @property
    def default_step_tokens(self) -> int:
        """The step budget a job takes when the user names none (--max-step-tokens): what runs
        prefill fastest here. Every step reads all the weights once, so a device whose products
        gain from many rows wants long steps. Default: 512."""
        return 512

    def max_step_tokens(self, max_seqs: int, max_blocks: Mapping[str, int]) -> int | None:
        """The most tokens one step can hold on this device, for steps of up to `max_seqs` sampled
        sequences whose block tables hold up to `max_blocks[group]` entries (as in `reserve`;
        after `allocate_kv`), or None for no limit. The engine keeps its step budget within it, so
        that no step of a planned run fails on a device limit. Default: no limit."""
        return None

    def last_step_device_seconds(self) -> float | None:
        """Time the device spent executing the last step (GPU timestamps), or None where the
        device and the host are the same (the CPU backend): benchmarks subtract it from a step's
        wall time to get the host's overhead."""
        return None

    def peak_memory(self) -> int:
        """Most bytes of device memory this backend has held at once (weights, KV, scratch)."""
        return 0

    def close(self) -> None:
        """Give back the device resources (weights, KV, buffers); the backend is unusable after.
        Nothing to do where memory is the process's own (the CPU)."""

    def measure_read_bandwidth(self, nbytes: int) -> float:
        """Bytes per second at which the device streams a buffer of `nbytes` (choose it several
        times the caches): the roofline against which a decode step is judged."""
        raise NotImplementedError(f"{self.name} cannot measure its memory bandwidth")

    overlaps = False  # whether `submit` returns while the device is still running the step
    small_step: int | None = None  # the most tokens a step holds at about a decode step's cost (Scheduler)
    MAX_IN_FLIGHT = 3  # steps submitted and not yet waited for

    def submit(self, batch: StepBatch) -> None:
        """Start a step; `wait` returns the results in submission order. Steps may be submitted
        before the ones before them are waited for (never more than MAX_IN_FLIGHT at once); a
        step's `token_sources` name tokens the step submitted just before it is sampling.
        Default: each step runs in `wait`, its sourced tokens filled in from the step before."""
        if len(self._submitted) >= self.MAX_IN_FLIGHT:
            raise RuntimeError(f"{self.MAX_IN_FLIGHT} steps are already in flight")
        self._submitted.append(batch)

    def allow(self, allowed: np.ndarray) -> None:
        """The grammar masks (`SamplingBatch.allowed`, which this sets) of the step submitted last,
        submitted with `masks_follow`: given while the device runs it, before the next `submit` or
        `wait`; the step's draws wait for them. Default: kept for `wait`, where the step runs."""
        sampling = self._submitted[-1].sampling if self._submitted else None
        if sampling is None or not sampling.masks_follow or sampling.allowed is not None:
            raise RuntimeError("allow() without a step submitted with masks_follow waiting for its masks")
        sampling.allowed = allowed

    def wait(self) -> StepResult:
        """The result of the oldest step submitted and not yet waited for."""
        batch = self._submitted.popleft()
        if batch.sampling is not None and batch.sampling.masks_follow and batch.sampling.allowed is None:
            raise RuntimeError("wait() before allow(): the step's grammar masks were never given")
        if batch.token_sources is not None:
            batch = replace(batch, token_ids=batch.sourced_tokens(self._last_ids))
        result = self.step(batch)
        self._last_ids = result.token_ids
        return result

    def discard(self) -> None:
        """Drop the oldest step submitted and not waited for, whose result nobody will read (every
        sequence in it has stopped; no step submitted after it may source tokens from it). The
        last step's ids and timings stay those of the step `wait` returned last. Default: the
        step, which would run in `wait`, does not run."""
        self._submitted.popleft()

    def run_segment(self, index: int, batch: StepBatch, x: np.ndarray | None,
                    out: np.ndarray | None = None) -> np.ndarray | StepResult:
        """A pipeline stage's part of a step: segment `index` of `segments`, from the batch's token
        ids where it begins with the embedding, else from `x` [T, H] float32, the residual stream
        before its first part; returns the stream after its last part [T, H] float32, written
        into `out` where given (the next stage's `stream_in`; the caller reads the stream before
        the next call), or the step's result where it ends with the head. A step runs its
        segments in order, each once, with the same batch, whose tokens are all given (no
        `token_sources`); no step is in flight meanwhile."""
        raise NotImplementedError(f"the {self.name} backend cannot run part of a model")

    def stream_in(self, batch: StepBatch) -> np.ndarray | None:
        """Where this stage reads the stream handed to its next segment of `batch`'s step, [T, H]
        float32 memory the stage before may write it into (so that it is not copied again), or
        None: it takes `x` wherever it is. Default: None."""
        return None

    @abstractmethod
    def step(self, batch: StepBatch) -> StepResult:
        """Run the model over the batch, write its K/V into the cache, sample the next tokens.

        Batch invariance: every value computed for a token (its K/V, logits, sampled id) must be
        bit-identical whatever else is in the batch, however its sequence's prompt was chunked.
        """
