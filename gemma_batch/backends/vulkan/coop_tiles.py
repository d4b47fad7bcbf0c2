"""How the cooperative-matrix matmuls cut their work: tiles, K chunks, variant names.

`shaders/matmul_coop_direct.comp` (the decode tile of fp16 and int8 weight tiles) and
`shaders/matmul_coop.comp` (the decode tile of int8 / int4 weights in rows and every prefill tile) take
a workgroup per tile of outputs x rows, and at decode sizes per K chunk as well; the chunking is
fixed per matrix (it sets the summation order, so batch invariance rests on it). The shaders'
own constants are named beside each value here; `variants.py` lists a variant per tile.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...switches import switched_on

COOP_DTYPES = ("T16", "T8", "I8", "I4", "Q4", "Q5")  # weight dtypes of the cooperative path (matmul_coop.comp reads each)
COOP_DIRECT_DTYPES = ("T16", "T8")  # ... whose decode tile is matmul_coop_direct.comp's
COOP_WIDE_DTYPES = ("T16",)  # ... whose prefill tiles include the 128-output ones (COOP_WIDE_DEFINES)
COOP_COLS, COOP_ROWS = 64, 32  # outputs and rows per workgroup of matmul_coop.comp (BN, BM)
COOP_DIRECT_COLS = 128  # outputs per workgroup of matmul_coop_direct.comp (its BM is COOP_ROWS)
# Above COOP_FOLD_ROWS rows (prefill) the `_fold` variants run instead: 8 subgroups of 2 x 2
# tiles, 64 outputs x 128 rows per workgroup (each weight read by 4x the rows); the same sums in
# the same order per output, so the results are bit for bit those of the decode tile.
COOP_FOLD_DEFINES = ("SG_N=2", "SG_M=4", "TN=2", "TM=2")
COOP_FOLD_TILE_ROWS = 128
# fp16 tiles' prefill runs a 128-output x 128-row tile where N allows, 8 subgroups: with fp16
# inputs (Kernels.x_lo False) `_wide`, 2 x 4 tiles each; with split inputs `_wide_split`, 4 x 2
# tiles each in stages of 32 k (x hi and lo of 64 k would not fit in shared memory). 4b on the
# H100, a layer's four matmuls at 4,096 / 16,384 rows with split inputs: 6.69-6.74 / 26.9-27.0
# ms against the 64-output tile's 7.13-7.39 / 29.4-30.3 (both with grouped row tiles; with fp16
# inputs this tile lost to `_wide`, 6.23 against 5.84-5.86 ms at 4,096 rows; the journal, `git show 4d73df3:docs/PERFORMANCE.md`).
COOP_WIDE_DEFINES = ("SG_N=4", "SG_M=2", "TN=2", "TM=4")
COOP_WIDE_SPLIT_DEFINES = ("SG_N=2", "SG_M=4", "TN=4", "TM=2", "KU=32")
COOP_WIDE_COLS = 128
# The prompt tile (matmul_coop.comp WHOLE_K): a step's prompt tokens, each output one sum over all
# of K, so it holds no chunk totals; the fp16-input tile then fits 128 registers in stages of 32 k
# (two workgroups an SM). 4b on the H100, the 8,192-token step's products: 222-228 ms against
# 369 for the chunk-order `_wide` tile (255 registers) and 313 with 64-k stages (179 registers);
# 4 x 4 tiles a subgroup 437, 4 x 2 287-296 (docs/EXPERIMENTS.md, "The prompt tile"). The other
# prefill tiles take WHOLE_K as they are.
COOP_WHOLE_WIDE_DEFINES = ("SG_N=4", "SG_M=2", "TN=2", "TM=4", "KU=32")
# With K no longer cut into chunks, a short block of prompt rows gives that tile few workgroups: a
# lone 128-token prompt at 4b prefilled 6,359 tok/s against 9,370 in K chunks. Where the 128-row
# tile would have fewer workgroups than the device has SMs (`coop_whole_small`), the fp16-input
# prompt tile runs 32 rows a workgroup instead: the same sums in the same order, so the same bits.
COOP_WHOLE_SMALL_DEFINES = ("SG_N=4", "SG_M=1", "TN=2", "TM=2")
COOP_WHOLE_SMALL_ROWS = 32
# The 64-output prefill tile (int8 / int4 weights, and fp16 tiles where N is no multiple of 128)
# has its 32-row prompt form too, the decode tile's shape: 4b's down projection (40 column tiles)
# ran a lone 128-token prompt on 40 workgroups for 132 SMs, 9.6 of a 21 ms step at int4.
COOP_FOLD_SMALL_DEFINES = ("SG_N=4", "SG_M=1", "TN=1", "TM=2")
PROMPT_TILE_ENV = "GEMMA_BATCH_VK_PROMPT_TILE"  # "0": prompt tokens' products in K chunks too, as before
# The chunk tile (matmul_coop.comp CHUNK_K): where a prefill tile's K chunks are workgroups of
# their own (chunked rows up to `coop_fold_rows`: decode steps of more than COOP_FOLD_ROWS tokens,
# a prefill step's decode rows), a build that holds only its chunk's sum, as the prompt tile holds
# only its one sum (the `_wide` form in its 32-k stages). The same sums, so the same bits.
CHUNK_TILE_ENV = "GEMMA_BATCH_VK_CHUNK_TILE"  # "0": those workgroups run the chunk-order prefill tile
COOP_KU = 64  # k per stage of matmul_coop.comp's tiles (the _wide_split tile's 32 divides it)
COOP_FOLD_ROWS = 64  # the most rows of a step on the decode tiles (pc.fold_rows of matmul_coop.comp and reduce.comp) ...
# ... or COOP_DIRECT_FOLD_ROWS where every layer matmul on the path has fp16 or int8 tiles
# (COOP_DIRECT_DTYPES: matmul_coop_direct.comp), `coop_decode_rows`. 4b on the H200, decode tok/s
# at batch 96 / 128 with 128 against 64: bf16 11,445 / 12,492 against 9,456 / 10,263, int8 8,999 /
# 9,762 against 6,753 / 8,251, batch 1 and 32 unchanged; int4's staged decode tile lost at 128
# (7,142 against 7,591), so it keeps 64 (docs/EXPERIMENTS.md, "The decode tiles up to 128 rows").
COOP_DIRECT_FOLD_ROWS = 128
WIDE_DECODE_ENV = "GEMMA_BATCH_VK_WIDE_DECODE"  # "0": the direct decode tile too takes at most COOP_FOLD_ROWS rows
LOGITS_IN_TILE_ENV = "GEMMA_BATCH_VK_LOGITS_IN_TILE"  # "0": the LM head's direct tile writes partial sums and a reduce the logits
COOP_TARGET_GROUPS = 512  # K is cut into chunks until a decode matmul has this many workgroups
COOP_MIN_CHUNK = 256  # ... or until a chunk would be shorter than this
# A prefill tile's workgroup sums its K chunks itself (and writes one partial) only where the
# step's tiles make at least this many workgroups an SM; in smaller prefill steps each chunk is a
# workgroup, as in decode steps, and the reduce adds the chunks: the same sums in the same order,
# so the same bits. A 159-row step (a 128-token prompt beside 31 decode rows) makes 2 x 20 tiles
# of down at 4b, 40 workgroups for 132 SMs, each over K = 10,240.
COOP_FOLD_GROUPS_PER_SM = 2
COOP_UNKNOWN_SMS = 16  # where the driver does not say how many SMs (compute units) the device has
# The prompt tile's forms (fp16 inputs), which `tuning.py` times on a device's first job to keep the fastest per matmul shape:
# each 128 outputs x 128 rows with every output one sum over K in 16-wide k blocks in order, so
# every form gives the same bits; they differ in how 8 subgroups share the tile and in k a stage.
# On the H200 the default was the fastest of 8 forms by 8.6% or more (docs/EXPERIMENTS.md, "The
# prompt tile's forms on the H200"); these three came next.
PROMPT_FORMS = {"4x2": COOP_WHOLE_WIDE_DEFINES, "8x1": ("SG_N=8", "SG_M=1", "TN=1", "TM=8", "KU=32"),
                "4x2k16": ("SG_N=4", "SG_M=2", "TN=2", "TM=4", "KU=16"),
                "2x4": ("SG_N=2", "SG_M=4", "TN=4", "TM=2", "KU=32")}
DEFAULT_PROMPT_FORM = "4x2"


def prompt_shape_key(N: int, K: int, gated: bool) -> str:
    """How a matmul's shape is named where its prompt-tile form is kept: "20480 x 2560 gated" (N
    the outputs, gate and up together where gated)."""
    return f"{N} x {K}" + (" gated" if gated else "")


def coop_fits(N: int, K: int) -> bool:
    """matmul_coop.comp's shape limits: whole workgroup tiles of each weight's N outputs (gated:
    gate and up are one matmul of 2 N, and no tile may span both), whole stages of K."""
    return N % COOP_COLS == 0 and K % COOP_KU == 0


def coop_chunks(N: int, K: int, min_chunk: int = COOP_MIN_CHUNK) -> int:
    """The number of K chunks of a cooperative matmul of N outputs (fixed per matrix: it sets the
    summation order, see matmul_coop.comp): doubled while the decode grid is small and the
    chunks stay at least `min_chunk` long and whole stages."""
    chunks = 1
    while (N // COOP_COLS * chunks < COOP_TARGET_GROUPS and K // (2 * chunks) >= min_chunk
           and K % (2 * chunks * COOP_KU) == 0):
        chunks *= 2
    return chunks


def coop_decode_rows(dtypes: Iterable[str]) -> int:
    """The most rows of a step on the decode tiles for layer matmuls of these weight `dtypes` on the
    path: COOP_DIRECT_FOLD_ROWS where each has direct tiles (and the user's switch allows), else
    COOP_FOLD_ROWS."""
    direct = all(dtype in COOP_DIRECT_DTYPES for dtype in dtypes) and switched_on(WIDE_DECODE_ENV)
    return COOP_DIRECT_FOLD_ROWS if direct else COOP_FOLD_ROWS


def coop_fold_rows(tiles: int, chunks: int, sm_count: int, decode_rows: int = COOP_FOLD_ROWS) -> int:
    """The most rows of a step in which each K chunk of a matmul is a workgroup of its own (above:
    the prefill tile's workgroup sums its chunks): at least `decode_rows` (the decode tiles'), and
    as long as the prefill tile's grid, COOP_FOLD_TILE_ROWS-row tiles by `tiles` column tiles, has
    fewer than COOP_FOLD_GROUPS_PER_SM workgroups for each of `sm_count` SMs (0: unknown)."""
    if chunks == 1:
        return decode_rows
    row_tiles = (COOP_FOLD_GROUPS_PER_SM * (sm_count or COOP_UNKNOWN_SMS) - 1) // tiles
    return max(decode_rows, row_tiles * COOP_FOLD_TILE_ROWS)


def coop_fold_rows_bound(N: int, chunks: int, sm_count: int) -> int:
    """`coop_fold_rows` of N outputs in whichever prefill tile (the widest has the fewest tiles)
    and with either decode tiles' rows."""
    return coop_fold_rows(-(-N // COOP_WIDE_COLS), chunks, sm_count, COOP_DIRECT_FOLD_ROWS)


def coop_partial_floats(max_rows: int, N: int, chunks: int, fold_rows: int) -> int:
    """Floats of the cooperative matmuls' partial sums (shaders/partial_rows.glsl) for any step of
    up to `max_rows` rows, D of them chunked and the rest prompt tokens' rows, each part padded to
    whole decode tiles (COOP_ROWS; the prefill tile writes only its 16-row tiles that hold rows,
    which stay within that): D rows times the chunks where D is at most `fold_rows`
    (`coop_fold_rows`), once above, then the prompt rows. Above `fold_rows` the two parts come to
    at most one COOP_ROWS more than max_rows padded; up to it, D's chunks to at most those of
    `fold_rows` rows."""
    def padded(M: int) -> int:
        return -(-M // COOP_ROWS) * COOP_ROWS
    return (padded(max_rows) + chunks * padded(min(max_rows, fold_rows))) * N


def coop_variant(defines: tuple[str, ...], dtype: str, fold: bool | str = False, whole: bool = False,
                 small: bool = False, chunk: bool = False, form: str = DEFAULT_PROMPT_FORM) -> str:
    """The cooperative matmul variant for weights of `dtype` with `defines` (GATED, ROWS or none),
    with the decode tile (matmul_coop_direct.comp's for COOP_DIRECT_DTYPES) or (`fold`)
    matmul_coop.comp's tile for steps of more than COOP_FOLD_ROWS rows (`fold="wide"` or
    "wide_split": the COOP_WIDE_DEFINES or COOP_WIDE_SPLIT_DEFINES tile); `whole`: that prefill
    tile as the prompt tile (WHOLE_K, `coop_tile_defines`), `small`: its 32-row form; `chunk`: as
    the chunk tile (CHUNK_K); `form`: the prompt tile's form (PROMPT_FORMS; "wide" only)."""
    return "_".join(["coop", *(d.lower() for d in defines), dtype.lower(), *(["fold"] if fold else []),
                     *([fold] if isinstance(fold, str) else []), *(["whole"] if whole else []), *(["small"] if small else []),
                     *(["chunk"] if chunk else []), *([f"f{form}"] if form != DEFAULT_PROMPT_FORM else [])])


def coop_tile_defines(fold: bool | str, whole: bool = False, small: bool = False, chunk: bool = False,
                      form: str = DEFAULT_PROMPT_FORM) -> tuple[str, ...]:
    """matmul_coop.comp's defines for the prefill tile `fold` (True, "wide" or "wide_split"), as
    the prompt tile where `whole` (`small`: its 32-row form, where `has_small_form`; `form`: which of
    PROMPT_FORMS, "wide" only) or the chunk tile where `chunk` (both hold one set of sums: "wide"
    takes the prompt tile's 32-k stages)."""
    if small:
        return (*(COOP_WHOLE_SMALL_DEFINES if fold == "wide" else COOP_FOLD_SMALL_DEFINES), "WHOLE_K")
    wide = PROMPT_FORMS[form] if whole else COOP_WHOLE_WIDE_DEFINES if chunk else COOP_WIDE_DEFINES
    tile = {"wide": wide, "wide_split": COOP_WIDE_SPLIT_DEFINES}.get(fold, COOP_FOLD_DEFINES)
    return (*tile, "WHOLE_K") if whole else (*tile, "CHUNK_K") if chunk else tile


def coop_fold(dtype: str, N: int, x_lo: bool) -> bool | str:
    """The prefill tile for N outputs of `dtype` weights with split inputs (`x_lo`) or fp16 ones:
    a 128-wide tile ("wide_split" or "wide") where it applies, else True."""
    if dtype in COOP_WIDE_DTYPES and N % COOP_WIDE_COLS == 0:
        return "wide_split" if x_lo else "wide"
    return True


def coop_cols(dtype: str, fold: bool | str) -> int:
    """Outputs per workgroup of that variant."""
    if isinstance(fold, str):
        return COOP_WIDE_COLS
    return COOP_DIRECT_COLS if dtype in COOP_DIRECT_DTYPES and not fold else COOP_COLS


def has_small_form(fold: bool | str) -> bool:
    """Whether the prefill tile `fold` has a 32-row prompt form (`coop_tile_defines(fold, True,
    True)`): the fp16-input 128-wide tile and the 64-output tile do, the split-input one not."""
    return fold in ("wide", True)


def coop_whole_small(rows: int, tiles: int, sm_count: int) -> bool:
    """Whether `rows` prompt rows of a matmul of `tiles` column tiles run the 32-row prompt tile:
    the 128-row one would have fewer workgroups than the SMs (`sm_count`, 0: unknown)."""
    return -(-rows // COOP_FOLD_TILE_ROWS) * tiles < (sm_count or COOP_UNKNOWN_SMS)


def prompt_tile_wanted() -> bool:
    """The user's switch (GEMMA_BATCH_VK_PROMPT_TILE=0: no prompt tile)."""
    return switched_on(PROMPT_TILE_ENV)


def chunk_tile_wanted() -> bool:
    """The user's switch (GEMMA_BATCH_VK_CHUNK_TILE=0: no chunk tile)."""
    return switched_on(CHUNK_TILE_ENV)


def logits_in_tile_wanted() -> bool:
    """The user's switch (GEMMA_BATCH_VK_LOGITS_IN_TILE=0: the LM head's logits from a reduce)."""
    return switched_on(LOGITS_IN_TILE_ENV)
