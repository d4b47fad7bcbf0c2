"""The cooperative-matrix form of one of the step's matmuls: split, coop, reduce (graph.py's module
doc says when a matmul takes it and what its reduce fuses). A part of `StepGraph`, which records
the step."""

from __future__ import annotations

from .coop_tiles import (COOP_DIRECT_DTYPES, DEFAULT_PROMPT_FORM, coop_chunks, coop_cols, coop_fold,
                         coop_fold_rows, coop_variant, has_small_form)
from .memory import Buffer
from .recordings import PROMPTLESS_MODES
from .variants import COOP_KINDS, COOP_REDUCE_WG, GATED_SPLIT_PIECE, ROWS_REDUCE_COLS


class CoopMatmul:
    """`StepGraph`'s recording of a matmul on the matrix units (it provides `cfg`, `b`, `inp`,
    `w`, `plan`, `kernels`, `mode` and `_dispatch`)."""

    def _coop_matmul(self, kind: str, layer: int, key: str, dtype: str, x: Buffer, y: Buffer, N: int, K: int,
                     norm: Buffer | None, extra: dict[int, Buffer] | None, presplit: bool,
                     split_next: dict[int, Buffer] | None, reduce_chunks: bool) -> None:
        """`_matmul` on the cooperative-matrix path: split, coop, reduce (see the module doc)."""
        cfg, b = self.cfg, self.b
        split, gemm, reduce = COOP_KINDS[kind]
        gated, rows = kind == "norm_gated", kind == "norm_rows"
        count = "rows" if rows else "tokens"
        if not presplit:
            inputs = {1: x, 2: b.split, 4: b.split_scale, **({3: norm} if norm is not None else {}),
                      **({5: self.inp.rows} if rows else {})}
            self._dispatch(split, inputs, {"K": K, "eps": cfg.rms_norm_eps}, (count, 1))
        cols = 2 * N if gated else N
        chunks = coop_chunks(cols, K, self.plan.coop_min_chunk)
        weights = {0: self.w.buffer(layer, key), **({4: self.w.buffer(layer, "up_proj")} if gated else {})}
        # The step's tokens before its prompt tokens (partial_rows.glsl): the decode tile for steps
        # of up to `decode_rows` tokens, the prefill tile for longer ones; the LM head's rows may
        # be few in a long step, so that recording has both for it. Then the prompt tokens' rows:
        # the prefill tile as the prompt tile (WHOLE_K), in every recording but the decode steps'.
        prefill_tile = coop_fold(dtype, cols, self.kernels.x_lo) if not rows else True
        folds = ((False, prefill_tile) if rows else (prefill_tile,)) if self.mode == "prefill" else (False,)
        # Up to fold_rows rows each K chunk is a workgroup; above, a prefill workgroup sums its own (coop_tiles).
        decode_rows = self.plan.decode_rows  # the decode tiles' most rows (coop_tiles.coop_decode_rows)
        fold_rows = decode_rows if rows else coop_fold_rows(
            -(-cols // coop_cols(dtype, prefill_tile)), chunks, self.kernels.dev.info.sm_count, decode_rows)
        push = {"N": cols, "K": K, "kchunk": K // chunks, "group": self.w.group(layer, key), "fold_rows": fold_rows}
        chunk_tile = self.chunk_tile and not rows  # chunks that are workgroups take the chunk tile (coop_tiles)
        # The LM head of one K chunk on the direct tile writes the logits itself (Y_OUT), so no
        # reduce follows; not in the prefill recordings, whose prefill tile may take its rows.
        y_out = rows and chunks == 1 and self.mode != "prefill" and dtype in COOP_DIRECT_DTYPES and self.logits_in_tile
        out_gemm, out = ((*gemm, "Y_OUT"), {2: y, 5: b.split_scale}) if y_out else (gemm, {2: b.partial})
        for fold in folds:
            tiles = -(-cols // coop_cols(dtype, fold))
            loop = " loop" if rows and not fold and dtype in COOP_DIRECT_DTYPES else ""  # (grids.py)
            above = ""
            if fold and chunk_tile:  # its chunks that are workgroups; the prefill tile takes the rows above
                self._dispatch(coop_variant(gemm, dtype, fold, chunk=True), {**weights, 1: b.split, 2: b.partial}, push,
                               (f"coopchunk_{count} {chunks} {fold_rows}", tiles))
                above = " above"
            grid = (f"coopfold_{count} {chunks} {fold_rows}{above}", tiles) if fold else (f"coop_{count} {chunks} {decode_rows}{loop}", tiles)
            self._dispatch(coop_variant(out_gemm, dtype, fold), {**weights, 1: b.split, **out}, push, grid)
        if not rows and self.mode not in PROMPTLESS_MODES:  # the prompt tokens' rows (none in those steps)
            tiles = -(-cols // coop_cols(dtype, prefill_tile))
            forms = ((False, "coopwhole_big"), (True, "coopwhole_small")) if has_small_form(prefill_tile) else ((False, "coopwhole"),)
            form = self.kernels.prompt_form(cols, K, gated) if prefill_tile == "wide" else DEFAULT_PROMPT_FORM  # (tuning.py)
            for small, kind in forms:  # (a 32-row form for short prompt blocks: coop_tiles.coop_whole_small)
                self._dispatch(coop_variant(gemm, dtype, prefill_tile, whole=True, small=small,
                                            form=DEFAULT_PROMPT_FORM if small else form),
                               {**weights, 1: b.split, 2: b.partial}, push, (kind, tiles))
        if not reduce_chunks or y_out:
            return
        epilogue = {} if gated or rows else (extra or {})  # the post-norm's or QK-norm/RoPE/KV buffers
        groups = {"reduce_post_norm": 1, "reduce_gated": -(-N // COOP_REDUCE_WG),  # (post-norm: a workgroup a row)
                  "reduce_rows": -(-N // ROWS_REDUCE_COLS)}.get(reduce, cfg.num_heads + 2 * cfg.num_kv_heads)
        if split_next is not None:  # also writes the next input's split
            reduce, epilogue = f"{reduce}_split", {**epilogue, 5: b.split, **split_next}
            if gated and self.mode == "decode":  # pieces of a row, the last splitting it
                epilogue, groups = {**epilogue, 6: b.row_sync}, -(-N // GATED_SPLIT_PIECE)
            elif gated:  # a workgroup per row
                reduce, groups = f"{reduce}_rows", 1
        self._dispatch(reduce, {0: b.partial, 2: y, 4: b.split_scale, **epilogue},
                       {"N": N, "chunks": chunks, "fold_rows": fold_rows, "eps": cfg.rms_norm_eps, "num_heads": cfg.num_heads,
                        "num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim}, (count, groups))
