"""Every compiled shader (`VARIANTS`): its GLSL source and defines, and the sizes the host
mirrors from the shaders (workgroups, tiles, rows a kernel holds) to size grids and constants.

`VARIANTS` is the one list of compiled shaders: `shaders/build.py` compiles each entry of it to
`spv/<name>.spv` (committed, so users need no shader compiler), and kernels.Kernels builds their
pipelines from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .coop_tiles import (COOP_DIRECT_DTYPES, COOP_DTYPES, COOP_WIDE_DTYPES, DEFAULT_PROMPT_FORM, PROMPT_FORMS,
                         coop_tile_defines, coop_variant, has_small_form)

SPV_DIR = Path(__file__).resolve().parent / "spv"

# Weight storage types (weights.py): as stored, quantized (int8 / int4, and int4 / int5 with min8
# scales: Q4 / Q5, model/quant.py), or fp16
# in 16 x 16 tiles (T16: bf16 / fp16 matrices of the cooperative-matrix path), or int8 in such tiles
# in fragment order (T8: int8 matrices of that path, where fragment_order.py knows the order).
WEIGHT_DEFINES = {"BF16": "W_BF16", "F16": "W_F16", "F32": "W_F32", "I8": "W_I8", "I4": "W_I4", "Q4": "W_Q4",
                  "Q5": "W_Q5", "T16": "W_T16", "T8": "W_T8"}
MATMUL_DTYPES = ("BF16", "F16", "F32", "I8", "I4", "Q4", "Q5")  # matmul.comp's
EMBED_DTYPES = ("BF16", "F16", "F32", "I8", "T16", "T8")  # embed.comp's (int4 keeps the embedding int8: model/conversion.py)
KV_DEFINES = {"float16": "KV_F16", "float32": "KV_F32", "bfloat16": "KV_BF16", "int8": "KV_I8"}  # shaders/kv_pages.glsl
MATMUL_KINDS = {  # kind -> defines (see the header of shaders/matmul.comp)
    "post_norm": ("EPI_NORM_ADD", "NT=2", "KSPLIT=4"),  # N = H is small: split K
    "norm_gated": ("NORM_IN", "GATED", "NT=2"),
    "norm_rows": ("NORM_IN", "ROW_GATHER", "NT=4"),
    **{f"norm_qk_rope_{kv}": ("NORM_IN", "EPI_QK_ROPE", define, "NT=2") for kv, define in KV_DEFINES.items()},
}
MATMUL_TEAMS = 4  # teams of 32 invocations per workgroup in matmul.comp
MATMUL_ROWS = 8  # MT: rows per workgroup
EPILOGUE_VEC4 = 12  # the largest EPI_VEC of shaders/matmul_epilogue.glsl: vec4 of a row per invocation
POST_NORM_WG = MATMUL_TEAMS * 32  # the post-norm epilogue runs in workgroups of 128 (matmul.comp and reduce.comp)
POST_NORM_MAX_ROW = EPILOGUE_VEC4 * 4 * POST_NORM_WG  # the longest row the post-norm epilogue holds
ATTENTION_MAX_GROUP = 16  # the default of attention.comp's GMAX: query heads per KV head
ATTENTION_MAX_QUERIES = 2048  # attention.comp's QMAX: G x head_dim values in shared memory

# The cooperative-matrix path (coopmat.py): per matmul kind, the split.comp variant that writes
# its input, the matmul_coop.comp defines, and the reduce.comp variant that sums its K chunks and
# runs the kind's epilogue.
COOP_KINDS = {
    "post_norm": ("split_plain", (), "reduce_post_norm"),
    "norm_gated": ("split_norm", ("GATED",), "reduce_gated"),
    "norm_rows": ("split_norm_rows", ("ROWS",), "reduce_rows"),
    **{f"norm_qk_rope_{kv}": ("split_norm", (), f"reduce_qk_rope_{kv}") for kv in KV_DEFINES},
}
COOP_REDUCE_WG = 128  # WG of reduce.comp's variants but the gated split and the post-norm
ROWS_REDUCE_COLS = 4 * COOP_REDUCE_WG  # outputs of a row per reduce_rows workgroup (the LM head's: 4 an invocation)
# gate/up's reduce writes down's split in pieces of GATED_SPLIT_PIECE columns of a row, a workgroup
# each (reduce_gated_split: 4 WG of reduce.comp), or a workgroup of GATED_ROW_WG invocations per row
# of up to GATED_SPLIT_MAX_ROW values (reduce_gated_split_rows: ACT_VEC * 4 * WG); graph.py picks.
GATED_SPLIT_PIECE, GATED_SPLIT_MAX_ROW, GATED_ROW_WG, GATED_ACT_ROUND = 4 * 512, 6 * 4 * 1024, 1024, 3
POST_NORM_ROW_MAX_WG = 1024  # reduce.comp's post-norm: invocations of its workgroup per row, at most


def post_norm_row_shape(hidden: int) -> tuple[int, int]:
    """reduce.comp's post-norm (a workgroup per row of `hidden` values): (invocations, vec4 each),
    as few vec4 an invocation as POST_NORM_ROW_MAX_WG invocations allow, invocations a multiple of
    32 (4b: 640, 1; 27b: 672, 2)."""
    vec = -(-hidden // (4 * POST_NORM_ROW_MAX_WG))
    return -(-hidden // (4 * vec * 32)) * 32, vec


def gated_row_vec(intermediate: int) -> int:
    """reduce_gated_split_rows' ACT_VEC: the vec4 of a row of `intermediate` values an invocation
    holds, in whole rounds of its ACT_ROUND (GATED_ACT_ROUND), at most what GATED_SPLIT_MAX_ROW
    needs (4b: 3, 27b: 6)."""
    rounds = -(-intermediate // (4 * GATED_ROW_WG * GATED_ACT_ROUND))
    return min(rounds * GATED_ACT_ROUND, GATED_SPLIT_MAX_ROW // (4 * GATED_ROW_WG))


def matmul_cols(kind: str) -> int:
    """Outputs per workgroup of a matmul kind: NWG = TEAMS / KSPLIT * NT of matmul.comp."""
    values = dict(d.split("=") for d in MATMUL_KINDS[kind] if "=" in d)
    return MATMUL_TEAMS // int(values.get("KSPLIT", 1)) * int(values["NT"])


@dataclass(frozen=True)
class Variant:
    """One compiled shader: `source` (a `.comp` in shaders/) built with `defines`."""

    name: str
    source: str
    defines: tuple[str, ...] = ()
    compiler: str = "glslc"  # "glslang": cooperative matrices, which Debian's glslc cannot compile

    @property
    def spv(self) -> Path:
        return SPV_DIR / f"{self.name}.spv"


def _variants() -> dict[str, Variant]:
    out = [Variant("sample", "sample"), Variant("row_scores", "row_scores"), Variant("read_bandwidth", "read_bandwidth"),
           Variant("tiles", "tiles")]
    out.append(Variant("coop_fragment_probe", "coop_fragment_probe", compiler="glslang"))
    for dtype in EMBED_DTYPES:
        out.append(Variant(f"embed_{dtype.lower()}", "embed", (WEIGHT_DEFINES[dtype],)))
    for dtype in MATMUL_DTYPES:
        for kind, extra in MATMUL_KINDS.items():
            out.append(Variant(f"matmul_{kind}_{dtype.lower()}", "matmul", (WEIGHT_DEFINES[dtype], *extra)))
    for kv, define in KV_DEFINES.items():  # on the coop path, _split: also writes the o projection's
        # split input; _split_qk: and makes its heads from qkv's K-chunk sums itself (decode steps)
        out += [Variant(f"attention_{kv}", "attention", (define,)),
                Variant(f"attention_{kv}_split", "attention", (define, "SPLIT_OUT")),
                Variant(f"attention_{kv}_split_qk", "attention", (define, "SPLIT_OUT", "QK_IN")),
                Variant(f"attention_flash_{kv}", "attention_flash", (define,), "glslang")]  # prompt tokens (flash.py)
    for dtype in COOP_DTYPES:
        for gemm in dict.fromkeys(defines for _, defines, _ in COOP_KINDS.values()):
            if dtype in COOP_DIRECT_DTYPES:
                out.append(Variant(coop_variant(gemm, dtype), "matmul_coop_direct", (WEIGHT_DEFINES[dtype], *gemm), "glslang"))
                if "ROWS" in gemm:  # the LM head writing its logits itself (graph_coop.py)
                    out.append(Variant(coop_variant((*gemm, "Y_OUT"), dtype), "matmul_coop_direct",
                                       (WEIGHT_DEFINES[dtype], *gemm, "Y_OUT"), "glslang"))
            else:
                out.append(Variant(coop_variant(gemm, dtype), "matmul_coop", (WEIGHT_DEFINES[dtype], *gemm), "glslang"))
            folds = (True, "wide", "wide_split") if dtype in COOP_WIDE_DTYPES and "ROWS" not in gemm else (True,)
            for fold in folds:  # (the LM head's N is no multiple of 128, so no wide tile; nor prompt rows)
                for whole in (False, True) if "ROWS" not in gemm else (False,):
                    out.append(Variant(coop_variant(gemm, dtype, fold, whole), "matmul_coop",
                                       (WEIGHT_DEFINES[dtype], *gemm, *coop_tile_defines(fold, whole)), "glslang"))
                if "ROWS" not in gemm:  # the chunk tile (the LM head's prefill tile never runs per chunk)
                    out.append(Variant(coop_variant(gemm, dtype, fold, chunk=True), "matmul_coop",
                                       (WEIGHT_DEFINES[dtype], *gemm, *coop_tile_defines(fold, chunk=True)), "glslang"))
                if has_small_form(fold) and "ROWS" not in gemm:  # the prompt tile's 32-row form (coop_tiles.coop_whole_small)
                    out.append(Variant(coop_variant(gemm, dtype, fold, True, True), "matmul_coop",
                                       (WEIGHT_DEFINES[dtype], *gemm, *coop_tile_defines(fold, True, True)), "glslang"))
                if fold == "wide":  # its other forms
                    out += [Variant(coop_variant(gemm, dtype, fold, True, form=form), "matmul_coop",
                                    (WEIGHT_DEFINES[dtype], *gemm, *coop_tile_defines(fold, True, form=form)), "glslang")
                            for form in PROMPT_FORMS if form != DEFAULT_PROMPT_FORM]
    out += [Variant("split_plain", "split"), Variant("split_norm", "split", ("NORM",)),
            Variant("split_norm_rows", "split", ("NORM", "ROW_GATHER")),
            Variant("reduce_post_norm", "reduce", ("EPI_NORM_ADD",)), Variant("reduce_gated", "reduce", ("GATED",)),
            Variant("reduce_post_norm_split", "reduce", ("EPI_NORM_ADD", "SPLIT_NEXT")),
            Variant("reduce_gated_split", "reduce", ("GATED", "SPLIT_NEXT")),
            Variant("reduce_gated_split_rows", "reduce", ("GATED", "SPLIT_NEXT", "WHOLE_ROWS")),
            Variant("reduce_rows", "reduce", ("ROWS",)),
            *(Variant(f"reduce_qk_rope_{kv}", "reduce", ("EPI_QK_ROPE", d)) for kv, d in KV_DEFINES.items())]
    return {v.name: v for v in out}


VARIANTS = _variants()


def matmul_variant(kind: str, dtype: str) -> str:
    return f"matmul_{kind}_{dtype.lower()}"
