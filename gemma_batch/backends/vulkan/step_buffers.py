"""The buffers one step uses besides weights and KV pages, sized for a capacity that only grows.

Host-visible inputs (`StepInputs`), written by the host before each submit (a few KiB per step):
`meta` (the step header of common.glsl), `tokens`, `positions`, `token_seq` (sequence of each
token; -1 for a prompt token on the flash kernel, which attention.comp skips), `flash_tiles`
(flash.py), per KV group `slots` and `tables` ([S, width] block ids), `rows` (the flat token of each
logits row), `params` (per-row sampling parameters), `masks` (grammar masks [S, ceil(V / 32)], a
row's params naming its sequence's; written while the step runs, `write_masks`), `score_rows`
and `score_ids` (row_scores.comp's score rows and pairs, in_flight.score_layout), `grids` (the
indirect dispatch sizes) and the outputs `ids` and `scores` (SCORES_PER_ROW a logits row). There is a set per step in flight (`sets`, the backend's MAX_IN_FLIGHT), used
by turns, so that a step can be written and submitted while the one before it runs (its tokens
may be read from the previous set's `ids`: embed.comp). A pipeline stage's set (`hidden` given)
also holds the residual stream handed over from the stage before, `x_in` [T, H] fp32, the one
it hands on, `x_out` (cached host memory, which the CPU reads fast), and `row_ids` (0..T-1: the
embedding kernel copies the streams as rows of a table, graph.py).
Device-local scratch, shared by the sets (one step runs at a time): the residual stream `x`
[T, H], `qkv`, `q`, `attn`, `y` [T, H], `act` [T, I] and `logits` [R, V], all fp32; the
`counters` of the matmul epilogues (one per row tile and head) and `row_sync` (per row, the
pieces of reduce.comp's gated split done and their max), both zeroed at the start of each step;
on the cooperative path the `split` inputs, their `split_scale` and the `partial` sums; and
attention's partial results per (chunk, token, kv head), `part_acc` [records, G * hd] and
`part_ml` [records, 2, G] (running max and sum), with `attn_counters` [T, nkv + 1] (the chunks
merged per (token, kv head), then the kv heads done per token; zeroed at the start of each
step). Records are T * nkv times the most chunks of any position the capacity's block tables can hold
(`attention.py`: at most MAX_CHUNKS; none when every context fits in one chunk).

When a step needs more than the capacity, everything here is reallocated (doubling), and the
backend records its command buffers again; steady state allocates nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ...model.config import Gemma3Config
from ..base import StepBatch
from .attention import most_chunks
from .grids import GRID_SLOTS
from .coop_tiles import coop_chunks, coop_fits, coop_fold_rows_bound, coop_partial_floats
from .variants import MATMUL_ROWS
from .memory import Buffer, Memory

PARAMS_DTYPE = np.dtype([  # mirrors RowParams in shaders/sample.comp
    ("temperature", np.float32), ("top_k", np.int32), ("top_p", np.float32), ("min_p", np.float32),
    ("key0", np.uint32), ("key1", np.uint32), ("counter", np.uint32), ("mask", np.uint32),
])


SCORES_PER_ROW = 64  # score pairs the buffers hold per logits row of the capacity (a row's choices: at most 64)
ROWS_PER_SEQ = 4  # logits rows the step buffers start with per sequence (VulkanBackend.reserve)
STEP_MEMORY_SHARE = 0.9  # of the memory left after the KV pages, the most the step buffers take
# The step budget of a job on the cooperative path (VulkanBackend.default_step_tokens), where the
# prefill products want many rows: 4b labelling job (32 x 1,024-token prompts) on the H100 through
# `gemma-batch run`, 2.00 s with steps of up to 8,192 tokens against 2.69 s with 512
# (docs/EXPERIMENTS.md, "The step budget of a job"); the portable kernels keep the base's 512.
PREFILL_STEP_TOKENS = 8192


@dataclass(frozen=True)
class Capacity:
    tokens: int
    seqs: int
    rows: int
    widths: tuple[tuple[str, int], ...]  # (KV group, block-table entries per sequence)

    def covers(self, other: Capacity) -> bool:
        mine = dict(self.widths)
        return (self.tokens >= other.tokens and self.seqs >= other.seqs and self.rows >= other.rows
                and all(mine.get(g, 0) >= w for g, w in other.widths))

    def grown_to(self, need: Capacity) -> Capacity:
        def up(have: int, want: int) -> int:
            while have < want:
                have *= 2
            return have

        mine = dict(self.widths)
        return Capacity(up(self.tokens, need.tokens), up(self.seqs, need.seqs), up(self.rows, need.rows),
                        tuple((g, up(mine.get(g, 1), w)) for g, w in need.widths))


MOST_STEP_TOKENS = 1 << 20  # where `fitting_step_tokens` stops looking


def first_capacity(widths: tuple[tuple[str, int], ...]) -> Capacity:
    """The capacity the step buffers start from, for block tables of these KV groups; it doubles
    from there (`Capacity.grown_to`)."""
    return Capacity(64, 32, 32, tuple((g, 16) for g, _ in widths))


def coop_matmuls(cfg: Gemma3Config) -> dict[str, tuple[int, int, int, bool]]:
    """The step's matmuls as the cooperative path sees them: key -> (N per weight, weights, K,
    rows are logits rows); gate and up are one matmul of 2 I outputs."""
    return {"qkv": (cfg.q_width + 2 * cfg.kv_width, 1, cfg.hidden_size, False),
            "o_proj": (cfg.hidden_size, 1, cfg.q_width, False),
            "gate_proj": (cfg.intermediate_size, 2, cfg.hidden_size, False),
            "down_proj": (cfg.hidden_size, 1, cfg.intermediate_size, False),
            "lm_head": (cfg.vocab_size, 1, cfg.hidden_size, True)}


class StepInputs:
    """One set of a step's host-visible inputs and its sampled ids (see the module doc)."""

    def __init__(self, memory: Memory, capacity: Capacity, vocab_size: int, name: str, hidden: int = 0) -> None:
        T, S, R = capacity.tokens, capacity.seqs, capacity.rows
        self.mask_words = -(-vocab_size // 32)
        self.widths = dict(capacity.widths)

        def host(size: int, what: str) -> Buffer:
            return memory.alloc_host(size, f"{what} ({name})")

        self.meta = host(20, "step header")
        self.tokens = host(4 * T, "token ids")
        self.positions = host(4 * T, "positions")
        self.token_seq = host(4 * T, "token sequences")
        self.flash_tiles = host(16 * (T + S), "flash tiles")  # at most T / tile + S tiles
        self.rows = host(4 * R, "logits rows")
        self.params = host(PARAMS_DTYPE.itemsize * R, "sampling parameters")
        self.masks = host(4 * S * self.mask_words, "grammar masks")
        self.score_rows = host(4 * (1 + 3 * R), "score rows")
        self.score_ids = host(4 * SCORES_PER_ROW * R, "score ids")
        self.scores = host(4 * SCORES_PER_ROW * R, "scores")
        self.grids = host(12 * GRID_SLOTS, "dispatch grids")
        self.ids = host(4 * R, "sampled ids")
        self.slots = {g: host(4 * T, f"{g} slots") for g, _ in capacity.widths}
        self.tables = {g: host(4 * S * w, f"{g} block tables") for g, w in capacity.widths}
        self.crossing: list[Buffer] = []  # a pipeline stage's x_in, x_out and row_ids (the module doc)
        if hidden:
            self.x_in, self.row_ids = host(4 * T * hidden, "activations in"), host(4 * T, "row ids")
            self.x_out = memory.alloc_host(4 * T * hidden, f"activations out ({name})", readback=True)
            self.crossing = [self.x_in, self.x_out, self.row_ids]
            StepBuffers.view(self.row_ids, np.int32, T)[:] = np.arange(T, dtype=np.int32)

    def write(self, batch: StepBatch, token_ids: np.ndarray, rows: np.ndarray, vocab_limit: int,
              grids: np.ndarray, flash: np.ndarray | None = None, tiles: np.ndarray | None = None,
              prompt_start: int | None = None, scores: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """The step's inputs: `token_ids` [T] as embed.comp reads them, the flat token of each of
        the R logits rows, the largest id to sample plus one, the indirect grids (grids.py); with
        the flash kernel, which tokens it serves [T] and its `tiles` (flash.py); the first token
        of the prompt tile (None: T, none; coop_tiles.prompt_start); row_scores.comp's header and
        pair ids (None: no scores)."""
        T, S, R = batch.num_tokens, batch.num_seqs, len(rows)
        StepBuffers.view(self.meta, np.uint32, 5)[:] = (T, S, R, vocab_limit, T if prompt_start is None else prompt_start)
        StepBuffers.view(self.tokens, np.int32, T)[:] = token_ids
        StepBuffers.view(self.positions, np.int32, T)[:] = batch.positions
        seqs = StepBuffers.view(self.token_seq, np.int32, T)
        seqs[:] = np.repeat(np.arange(S, dtype=np.int32), np.diff(batch.seq_starts))
        if flash is not None:
            seqs[flash] = -1
            StepBuffers.view(self.flash_tiles, np.int32, tiles.size)[:] = tiles.ravel()
        StepBuffers.view(self.rows, np.int32, R)[:] = rows
        for group, table in batch.block_tables.items():
            StepBuffers.view(self.slots[group], np.int32, T)[:] = batch.slots[group]
            width = self.widths[group]
            StepBuffers.view(self.tables[group], np.int32, S * width).reshape(S, width)[:, : table.shape[1]] = table
        _fill_params(StepBuffers.view(self.params, PARAMS_DTYPE, R), batch, rows)
        header, ids = (np.zeros(1, np.uint32), np.zeros(0, np.int32)) if scores is None else scores
        StepBuffers.view(self.score_rows, np.uint32, len(header))[:] = header
        StepBuffers.view(self.score_ids, np.int32, len(ids))[:] = ids
        StepBuffers.view(self.grids, np.uint32, self.grids.size // 4)[:] = grids.ravel()

    def write_masks(self, allowed: np.ndarray, sample: np.ndarray, id_rows: np.ndarray) -> None:
        """The step's grammar masks (`SamplingBatch.allowed` [S, words]): each sampled sequence's
        that holds an id off, named by its draw's row `id_rows[s]` (the others allow every id)."""
        masked = np.flatnonzero(sample & (allowed != -1).any(axis=1))
        words = StepBuffers.view(self.masks, np.int32, len(allowed) * self.mask_words).reshape(-1, self.mask_words)
        words[masked] = allowed[masked]
        params = StepBuffers.view(self.params, PARAMS_DTYPE, int(id_rows.max(initial=-1)) + 1)
        params["mask"][id_rows[masked]] = masked + 1

    def all(self) -> list[Buffer]:
        return [self.meta, self.tokens, self.positions, self.token_seq, self.flash_tiles, self.rows, self.params,
                self.masks, self.score_rows, self.score_ids, self.scores, self.grids, self.ids, *self.slots.values(),
                *self.tables.values(), *self.crossing]


def _fill_params(params: np.ndarray, batch: StepBatch, rows: np.ndarray) -> None:
    """Per logits row: its sequence's sampling parameters; greedy for rows that are not sampled
    (the rows of every token, when the step returns logits)."""
    params[:] = 0
    params["top_p"] = 1.0
    s = batch.sampling
    if s is None:
        return
    seq_of_row = np.searchsorted(batch.seq_starts, rows, side="right") - 1
    sampled = rows == batch.seq_starts[1:][seq_of_row] - 1
    take = seq_of_row[sampled]
    for field in ("temperature", "top_k", "top_p", "min_p", "counter"):
        source = s.counters if field == "counter" else getattr(s, field)
        params[field][sampled] = source[take]
    params["key0"][sampled] = s.keys[take, 0]
    params["key1"][sampled] = s.keys[take, 1]


def scratch_sizes(cfg: Gemma3Config, capacity: Capacity, block_size: int, attention_chunk: int,
                  coop_min_chunk: int | None, sm_count: int) -> dict[str, tuple[int, str]]:
    """Each device-local scratch buffer of `StepBuffers` for `capacity`: attribute -> (bytes, label).
    Arguments as `StepBuffers`'."""
    T, R = capacity.tokens, capacity.rows
    H, I, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    widths = dict(capacity.widths)
    chunks = max(most_chunks(np.arange(widths[g.name] * block_size), g.window, attention_chunk)
                 for g in cfg.kv_groups())
    records = T * cfg.num_kv_heads * chunks if chunks > 1 else 0
    heads = cfg.num_heads + 2 * cfg.num_kv_heads
    # The cooperative path: split rows [hi K | lo K] fp16 with their scales, and partial sums.
    coop = {} if coop_min_chunk is None else {  # (outputs, K, rows) of each matmul on the path
        key: (N * weights, K, R if rows else T) for key, (N, weights, K, rows) in coop_matmuls(cfg).items()
        if coop_fits(N, K)}
    M = max(T, R) if coop else 0

    def partial_floats(N: int, K: int, rows: int) -> int:
        chunks = coop_chunks(N, K, coop_min_chunk)
        return coop_partial_floats(rows, N, chunks, coop_fold_rows_bound(N, chunks, sm_count))

    return {
        "x": (4 * T * H, "residual stream"),
        "qkv": (4 * T * (cfg.q_width + 2 * cfg.kv_width), "qkv activations"),
        "q": (4 * T * cfg.q_width, "queries"),
        "attn": (4 * T * cfg.q_width, "attention output"),
        "y": (4 * T * H, "projection output"),
        "act": (4 * T * I, "MLP activations"),
        "logits": (4 * R * V, f"logits of {R} rows"),
        "counters": (4 * -(-T // MATMUL_ROWS) * heads, "epilogue counters"),
        "part_acc": (4 * records * cfg.q_width // cfg.num_kv_heads, f"attention partials ({chunks} chunks)"),
        "part_ml": (4 * records * 2 * cfg.num_heads // cfg.num_kv_heads, "attention partial maxima and sums"),
        "attn_counters": (4 * T * (cfg.num_kv_heads + 1), "attention merge and row counters"),
        "split": (4 * M * max([K for _, K, _ in coop.values()], default=0), "split matmul inputs"),
        "split_scale": (4 * M, "split row scales"),
        "row_sync": (4 * 2 * max(M, 1), "row counters and maxima (reduce.comp)"),
        "partial": (4 * max([partial_floats(*shape) for shape in coop.values()], default=0), "matmul partial sums"),
    }


def fitting_step_tokens(cfg: Gemma3Config, limit: int, max_seqs: int, max_blocks: Mapping[str, int], block_size: int,
                        attention_chunk: int, coop_min_chunk: int | None, sm_count: int, total: int | None = None) -> int:
    """`VulkanBackend.max_step_tokens`: the step buffers grow in doubles of `first_capacity`'s tokens
    (`VulkanBackend._ensure`); the largest such capacity whose every scratch buffer is at most `limit`
    bytes, the device's largest storage buffer (at 27b with 32 attention chunks a query, 8,192 tokens
    would need a 4 GiB buffer of partial results), and all of them together at most `total` bytes
    (None: no such bound). Other arguments as `StepBuffers`'."""
    widths = tuple(sorted(max_blocks.items()))

    def fits(tokens: int) -> bool:
        capacity = first_capacity(widths).grown_to(Capacity(tokens, max_seqs, max_seqs, widths))
        sizes = [size for size, _ in scratch_sizes(cfg, capacity, block_size, attention_chunk, coop_min_chunk,
                                                   sm_count).values()]
        return max(sizes) <= limit and (total is None or sum(sizes) <= total)

    tokens = first_capacity(widths).tokens
    while tokens < MOST_STEP_TOKENS and fits(2 * tokens):
        tokens *= 2
    return tokens


class StepBuffers:
    def __init__(self, cfg: Gemma3Config, memory: Memory, capacity: Capacity, block_size: int,
                 attention_chunk: int, coop_min_chunk: int | None, sets: int, sm_count: int, crossing: bool = False) -> None:
        """`sets`: how many sets of inputs take turns (the backend's steps in flight); `crossing`:
        they hold a pipeline stage's hand-over buffers (StepInputs).
        `coop_min_chunk`: with the cooperative-matrix path (coopmat.py), its shortest K chunk
        (coop_tiles.coop_chunks); None without it. Its buffers are sized for every matmul whose
        shape fits, whatever its weights' dtype, on a device of `sm_count` SMs (0: unknown;
        coop_tiles.coop_fold_rows)."""
        self.cfg, self.mem, self.capacity = cfg, memory, capacity
        self.inputs = tuple(StepInputs(memory, capacity, cfg.vocab_size, f"set {i}", cfg.hidden_size if crossing else 0)
                            for i in range(sets))
        size = scratch_sizes(cfg, capacity, block_size, attention_chunk, coop_min_chunk, sm_count)
        dev = memory.alloc
        self.x, self.qkv, self.q = dev(*size["x"]), dev(*size["qkv"]), dev(*size["q"])
        self.attn, self.y, self.act = dev(*size["attn"]), dev(*size["y"]), dev(*size["act"])
        self.logits, self.counters = dev(*size["logits"]), dev(*size["counters"])
        self.part_acc, self.part_ml = dev(*size["part_acc"]), dev(*size["part_ml"])
        self.attn_counters = dev(*size["attn_counters"])
        self.split, self.split_scale = dev(*size["split"]), dev(*size["split_scale"])
        self.row_sync, self.partial = dev(*size["row_sync"]), dev(*size["partial"])
        self.dummy = self.inputs[0].meta

    def all(self) -> list[Buffer]:
        scratch = [self.x, self.qkv, self.q, self.attn, self.y, self.act, self.logits, self.counters, self.part_acc,
                   self.part_ml, self.attn_counters, self.split, self.split_scale, self.row_sync, self.partial]
        return scratch + [buf for inputs in self.inputs for buf in inputs.all()]

    def device_bytes(self) -> int:
        """Device memory behind the scratch buffers (the host-visible inputs not counted)."""
        return sum(buf.reserved for buf in self.all() if buf.array is None)

    def free(self) -> None:
        for buf in self.all():
            self.mem.free(buf)

    @staticmethod
    def view(buf: Buffer, dtype, count: int) -> np.ndarray:
        return buf.array[: count * np.dtype(dtype).itemsize].view(dtype)
