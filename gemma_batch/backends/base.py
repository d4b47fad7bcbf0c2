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
from dataclasses import dataclass, replace

import numpy as np

from ..model.checkpoint import Tensor
from ..model.config import Gemma3Config
from ..model.quant import QuantizedTensor
from .placement import Segment


@dataclass
class SamplingBatch:
    """Per-sequence sampling parameters of a step (see `backends.sampler` for the exact rule).

    Randomness is counter-based: the uniform number for a sequence's draw is a pure function of
    its `keys` row (derived from the job seed and the row id) and `counters` (the index of the
    token being sampled), so it never depends on the batch.
    """

    temperature: np.ndarray  # [S] float32, 0 = greedy
    top_k: np.ndarray  # [S] int32, 0 = off
    top_p: np.ndarray  # [S] float32, 1 = off
    min_p: np.ndarray  # [S] float32, 0 = off
    keys: np.ndarray  # [S, 2] uint32 Philox key of each sequence
    counters: np.ndarray  # [S] uint32, index of the completion token being drawn
    vocab_size: int = 0  # draw only ids below this (0: any); 4B+ checkpoints have padding rows
    # [S, ceil(V / 32)] int32 or None: bit j of word w allows token 32 w + j (a constrained
    # completion's grammar, `engine.constraints`); -1 words allow all. None: every token allowed.
    allowed: np.ndarray | None = None
    # `allowed` comes after `Backend.submit`, through `Backend.allow`, computed on the host while
    # the device runs the step; its draws wait for it.
    masks_follow: bool = False


@dataclass
class StepBatch:
    """One step over a flattened ("varlen") batch of S sequences and T tokens.

    Prefill chunks and single decode tokens are mixed; sequence s owns the flat token range
    `seq_starts[s]:seq_starts[s+1]`, whose positions are consecutive and end at
    `context_lens[s] - 1`.
    """

    token_ids: np.ndarray  # [T] int32
    positions: np.ndarray  # [T] int32, index of each token in its sequence (<bos> is 0)
    seq_starts: np.ndarray  # [S+1] int32
    context_lens: np.ndarray  # [S] int32, tokens in the sequence's cache after this step
    block_tables: dict[str, np.ndarray]  # KV group -> [S, max_blocks] int32 block ids, -1 = none
    slots: dict[str, np.ndarray]  # KV group -> [T] int32 slot where each new token's K/V goes
    sample: np.ndarray  # [S] bool, whether the sequence's last token this step is sampled
    sampling: SamplingBatch | None = None  # None: greedy for every sequence
    return_logits: bool = False  # also return the logits of every token (tests, scoring)
    # [T] int32 or None: -1 where `token_ids` holds the token; s >= 0 where the token is the one
    # the step submitted just before this one samples for its sequence s (token_ids has
    # sequence.PENDING there). Lets the engine submit a step before the one before it finished.
    token_sources: np.ndarray | None = None
    # [S] int32 or None: each sequence's prompt length. A backend may run the attention and the
    # products of prompt tokens (positions below it) on other kernels than those of the rest, in
    # other summation orders, as long as the choice depends on the token alone (batch invariance).
    # A sequence's tokens in a step are all prompt tokens or none, and the sequences of prompt
    # tokens come after the others (the engine's scheduler keeps this). None: no prompt tokens.
    prompt_lens: np.ndarray | None = None
    # [R] int32 or None: flat token indices whose logits come back in `StepResult.row_logits`
    # (a token's log-probabilities, `engine.token_logprobs`), besides what `return_logits` asks for.
    logit_rows: np.ndarray | None = None
    # [P] int32 each, or None: the log-probability of token `score_ids[p]` after flat token
    # `score_tokens[p]` comes back in `StepResult.scores` [P]: a log-softmax of that token's logits
    # over the ids below the sampling vocabulary (no temperature, no mask; `sampler.log_softmax`),
    # without its row of logits read back (scoring a row's choices, `engine.choices`).
    score_tokens: np.ndarray | None = None
    score_ids: np.ndarray | None = None

    def sourced_tokens(self, values: np.ndarray) -> np.ndarray:
        """`token_ids` with each token named by `token_sources` taken from `values` [S of the
        step before] at its sequence there."""
        if self.token_sources is None:
            return self.token_ids
        fed = self.token_sources >= 0
        out = self.token_ids.copy()
        out[fed] = values[self.token_sources[fed]]
        return out

    def score_rows(self) -> np.ndarray:
        """The flat tokens of `score_tokens`, each once, ascending (empty without scores). Sorted
        by hand: numpy 2.4's np.unique took 12-19 ms on its first call in a process."""
        if self.score_tokens is None:
            return np.zeros(0, np.int32)
        tokens = np.sort(self.score_tokens)
        return tokens[np.concatenate([[True], tokens[1:] != tokens[:-1]])]

    def prompt_mask(self) -> np.ndarray:
        """[T] bool: the tokens whose positions are below their sequence's prompt length."""
        if self.prompt_lens is None:
            return np.zeros(self.num_tokens, bool)
        return self.positions < np.repeat(np.asarray(self.prompt_lens), np.diff(self.seq_starts))

    def prompt_start(self, prompt: np.ndarray | None = None) -> int:
        """The first prompt token (T: none; `prompt`: `prompt_mask()` if already made); ValueError
        if prompt tokens do not come last, every sequence's tokens all prompt tokens or none (the
        contract on `prompt_lens`)."""
        prompt = self.prompt_mask() if prompt is None else prompt
        start = len(prompt) - int(prompt.sum())
        if not prompt[start:].all():
            raise ValueError("a step's prompt tokens must come after its other tokens, and a sequence's tokens in a "
                             "step must be all prompt tokens or none (StepBatch.prompt_lens; the engine's scheduler "
                             "keeps this)")
        return start

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


NON_FINITE = -2  # StepResult.token_ids of a sequence whose logits held a NaN or +inf (corrupt weights, overflow)


@dataclass
class StepResult:
    """What comes back from a step: only the sampled ids, unless logits were asked for."""

    token_ids: np.ndarray  # [S] int32: the next token of each sampled sequence, -1 elsewhere, NON_FINITE
    logits: np.ndarray | None = None  # [T, V] float32 when `StepBatch.return_logits`
    row_logits: np.ndarray | None = None  # [R, V] float32 of `StepBatch.logit_rows`, in their order
    scores: np.ndarray | None = None  # [P] float64 of `StepBatch.score_tokens`, in their order


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
