"""The indirect dispatch grids of a recorded step: one slot per distinct (kind, n), filled per step.

A recording names each dispatch's grid by a kind and a multiplier n (`offset`); the host then
writes every slot's workgroup count for the step's sizes (`counts`), so nothing recorded depends
on T, R or the positions. Kinds:

    "tokens" / "rows"                T * n / R * n workgroups
    "matmul_tokens" / "matmul_rows"  row tiles of M (T or R) times n column tiles (matmul.comp)
    "coop_tokens C F" / "coop_rows C F"  the cooperative decode tiles of the chunked rows (D: the
                                     step's tokens before its prompt tokens, or R) times their C
                                     chunks of K; none above F rows (coop_tiles.coop_decode_rows); with a last word
                                     "loop" (the LM head on matmul_coop_direct.comp, whose
                                     workgroups loop over the tiles) at most ROWS_GROUPS_PER_SM
                                     workgroups an SM where the device says how many SMs it has
    "coopfold_tokens C F" / "coopfold_rows C F"  the prefill tiles of the chunked rows, times their
                                     C chunks of K up to F rows (coop_tiles.coop_fold_rows); for
                                     rows none up to F (the decode tile's most rows); with a
                                     last word "above", none up to F rows (the chunk tile's)
    "coopchunk_tokens C F"           the chunk tile's: the prefill tiles of the chunked rows times
                                     their C chunks of K, up to F rows; none above
    "coopwhole"                      the prompt tile's (matmul_coop.comp WHOLE_K) over the T - D
                                     prompt tokens' rows; "coopwhole_big" / "coopwhole_small"
                                     the same for a tile with a 32-row form: one of the two, as
                                     coop_tiles.coop_whole_small says
    "attention <group>"              T * n times the step's most chunks of a token attention.comp
                                     serves in that KV group; T * n alone where those tokens
                                     fill the device (attention.serial_grid)
    "flash"                          the step's flash tiles (flash.py) times n
"""

from __future__ import annotations

import numpy as np

from ...model.config import Gemma3Config
from ...switches import switched_on
from .attention import SERIAL_ENV, most_chunks, serial_grid
from .coop_tiles import COOP_FOLD_TILE_ROWS, COOP_ROWS, COOP_WHOLE_SMALL_ROWS, coop_whole_small
from .variants import MATMUL_ROWS

GRID_SLOTS = 80  # distinct indirect grids (3 uint32 each)
# The LM head's decode matmul (2,049 tiles at 4b) as 4 workgroups an SM looping over the tiles,
# not a workgroup a tile with a last partial wave: 4b on the H100 (132 SMs), median decode step
# 5.29-5.30 against 5.36-5.37 ms at batch 1, 6.33-6.35 against 6.36-6.38 at 32 (the journal, `git show 4d73df3:docs/PERFORMANCE.md`).
ROWS_GROUPS_PER_SM = 4
MAX_GROUPS_X = 32768  # larger counts spread over y (common.glsl linear_group)


class DispatchGrids:
    def __init__(self, cfg: Gemma3Config, attention_chunk: int, sm_count: int = 0) -> None:
        """`attention_chunk`: the smallest span of key positions of an attention workgroup (attention.py);
        `sm_count`: the device's streaming multiprocessors (0: unknown, no cap on the LM head's grid)."""
        self.attention_chunk = attention_chunk
        self.rows_cap = ROWS_GROUPS_PER_SM * sm_count or None
        self.sm_count = sm_count
        self.serial_allowed = switched_on(SERIAL_ENV)
        self._windows = {g.name: g.window for g in cfg.kv_groups()}
        self.nkv = cfg.num_kv_heads
        self._specs: list[tuple[str, int]] = []  # (kind, n) of each slot
        # ... parsed once: (counts rows?, kind's first word, n, K chunks, rows up to which the prefill
        # tile's chunks are workgroups, attention window or False, capped?, "above"?)
        self._parsed: list[tuple[bool, str, int, int, int, int | None | bool, bool, bool]] = []

    def offset(self, kind: str, n: int) -> int:
        """Byte offset of the slot for grid (`kind`, `n`) in the grids buffer."""
        spec = (kind, n)
        if spec not in self._specs:
            if len(self._specs) == GRID_SLOTS:
                raise RuntimeError("more distinct dispatch grids than GRID_SLOTS")
            self._specs.append(spec)
            words = kind.split()
            window = self._windows[words[1]] if words[0] == "attention" else False
            chunks = int(words[1]) if words[0].startswith("coop") and len(words) > 1 else 1
            fold_rows = int(words[2]) if words[0].startswith(("coop_", "coopfold", "coopchunk")) else 0  # (coop_: decode rows)
            capped = words[-1] == "loop" and self.rows_cap is not None
            above = words[-1] == "above"
            self._parsed.append((words[0].endswith("rows"), words[0], n, chunks, fold_rows, window, capped, above))
        return 12 * self._specs.index(spec)

    def counts(self, num_tokens: int, num_rows: int, positions: np.ndarray, flash_tiles: int = 0,
               prompt_start: int | None = None) -> np.ndarray:
        """[GRID_SLOTS, 3] uint32 workgroup counts for a step of T tokens and R logits rows, whose
        tokens that attention.comp serves are at `positions` (all T, but for prompt tokens on
        the flash kernel), with `flash_tiles` tiles of those (flash.py), and whose tokens from
        `prompt_start` on (None: none) run the prompt tile."""
        out = np.zeros((GRID_SLOTS, 3), np.uint32)
        chunked = num_tokens if prompt_start is None else prompt_start
        # attention.comp tells the serial grid from the chunked one by its size
        serial = serial_grid(len(positions) * self.nkv, self.sm_count, self.serial_allowed)
        for i, (rows, kind, n, chunks, fold_rows, window, capped, above) in enumerate(self._parsed):
            m = num_rows if rows else num_tokens
            if kind.startswith("matmul"):
                count = -(-m // MATMUL_ROWS) * n
            elif kind.startswith("coopwhole"):
                prompt = num_tokens - chunked
                small = coop_whole_small(prompt, n, self.sm_count)
                rows_per = COOP_WHOLE_SMALL_ROWS if kind == "coopwhole_small" else COOP_FOLD_TILE_ROWS
                on = kind == "coopwhole" or small == (kind == "coopwhole_small")
                count = -(-prompt // rows_per) * n if on else 0
            elif kind.startswith("coopfold"):  # the prefill tile: for rows, no workgroups at decode sizes
                m = m if rows else chunked
                floor = fold_rows if above or rows else 0
                count = -(-m // COOP_FOLD_TILE_ROWS) * n * (chunks if m <= fold_rows else 1) if m > floor else 0
            elif kind.startswith("coopchunk"):  # the chunk tile: the prefill tile's chunks that are workgroups
                m = m if rows else chunked
                count = -(-m // COOP_FOLD_TILE_ROWS) * n * chunks if m <= fold_rows else 0
            elif kind.startswith("coop"):  # the decode tile: none above the fold
                m = m if rows else chunked
                count = -(-m // COOP_ROWS) * n * chunks if m <= fold_rows else 0
                if capped:
                    count = min(count, self.rows_cap)
            elif kind == "flash":
                count = flash_tiles * n
            else:
                count = m * n
            if window is not False and not serial:
                count *= most_chunks(positions, window, self.attention_chunk)
            x = min(count, MAX_GROUPS_X)
            out[i] = (x, -(-count // x) if x else 1, 1)
        return out
