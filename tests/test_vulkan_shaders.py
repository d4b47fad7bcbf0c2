"""The shader sources and their committed SPIR-V: nothing stale, and every push-constant layout
written the same on both sides (GLSL `Push` block, numpy dtype in push_constants.PUSH)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gemma_batch.backends.vulkan import pipeline_stats
from gemma_batch.backends.vulkan.attention import MAX_CHUNKS, SERIAL_ENV, SERIAL_PAIRS_PER_SM, chunk_counts
from gemma_batch.backends.vulkan.coop_tiles import (COOP_DIRECT_FOLD_ROWS, COOP_FOLD_ROWS, COOP_UNKNOWN_SMS, WIDE_DECODE_ENV,
                                                    coop_decode_rows, coop_fold_rows, coop_partial_floats)
from gemma_batch.backends.vulkan.grids import ROWS_GROUPS_PER_SM, DispatchGrids
from gemma_batch.backends.vulkan.push_constants import PUSH, PUSH_BYTES
from gemma_batch.backends.vulkan.recordings import recording_for, recording_modes
from gemma_batch.backends.vulkan.variants import (GATED_ACT_ROUND, GATED_ROW_WG, GATED_SPLIT_MAX_ROW, VARIANTS,
                                                  gated_row_vec)
from gemma_batch.bench.shapes import shape_config

SHADERS = Path(__file__).resolve().parent.parent / "shaders"
_GLSL_TYPES = {"uint": np.dtype(np.uint32), "int": np.dtype(np.int32), "float": np.dtype(np.float32)}


def test_committed_spirv_is_built_from_the_current_sources():
    done = subprocess.run([sys.executable, str(SHADERS / "build.py"), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, f"stale shaders; run `python shaders/build.py`:\n{done.stdout}{done.stderr}"


# kv_pages.glsl: included by matmul_epilogue.glsl, not by the .comp itself
@pytest.mark.parametrize("edited", ["matmul.comp", "matmul_epilogue.glsl", "common.glsl", "kv_pages.glsl"])
def test_the_staleness_check_notices_an_edited_source_or_header(tmp_path, monkeypatch, edited):
    sys.path.insert(0, str(SHADERS))
    import build  # shaders/build.py

    variant = VARIANTS["matmul_post_norm_bf16"]
    entry = build.load_manifest()[variant.name]
    assert entry["source"] == build.source_hash(variant)
    for source in [*SHADERS.glob("*.comp"), *SHADERS.glob("*.glsl")]:  # every header the variant may include
        text = source.read_text()
        (tmp_path / source.name).write_text(text + "\n// an edit\n" if source.name == edited else text)
    monkeypatch.setattr(build, "HERE", tmp_path)
    assert build.source_hash(variant) != entry["source"]


@pytest.mark.parametrize("family", sorted(PUSH))
def test_push_constant_blocks_match_their_numpy_layouts(family):
    source = (SHADERS / f"{family}.comp").read_text()
    block = re.search(r"layout\(push_constant\)\s*uniform\s+Push\s*\{(.*?)\}", source, re.S)
    assert block, f"{family}.comp has no Push block"
    fields = re.findall(r"(\w+)\s+(\w+)\s*;", block.group(1))
    assert [name for _, name in fields] == list(PUSH[family].names)
    assert [_GLSL_TYPES[t] for t, _ in fields] == [PUSH[family][name] for name in PUSH[family].names]
    assert PUSH[family].itemsize <= PUSH_BYTES


def test_every_variant_has_its_source():
    for variant in VARIANTS.values():
        assert (SHADERS / f"{variant.source}.comp").exists()
        assert variant.source in PUSH


def test_the_attention_chunk_rule_is_mirrored_on_the_host():
    """attention.py sizes grids and scratch by the shader's rule; worked out by hand for chunk 64."""
    source = (SHADERS / "attention.comp").read_text()
    assert int(re.search(r"#define MAX_CHUNKS (\d+)", source).group(1)) == MAX_CHUNKS == 32
    # Global layer, keys [0, p]: p // 64 + 1 chunks up to 32, then the span doubles (128, 256).
    positions = np.array([0, 63, 64, 2047, 2048, 4095, 4096])
    assert chunk_counts(positions, None, 64).tolist() == [1, 1, 2, 32, 17, 32, 17]
    # Sliding window 512, keys [p - 511, p]: aligned chunks of absolute positions.
    positions = np.array([511, 512, 600, 639, 640])
    assert chunk_counts(positions, 512, 64).tolist() == [8, 9, 9, 8, 9]


def test_the_gated_reduce_row_limit_is_mirrored_on_the_host():
    """coop_plan.py fuses gate/up's split into its reduce for rows of up to
    variants.GATED_SPLIT_MAX_ROW values, which reduce_gated_split_rows holds in registers: ACT_VEC
    vec4 for each of its invocations (at most its default), in rounds of ACT_ROUND that
    variants.gated_row_vec keeps whole."""
    source = (SHADERS / "reduce.comp").read_text()
    act_vec = int(re.search(r"const uint ACT_VEC = (\d+)u;", source).group(1))
    assert int(re.search(r"#define ACT_ROUND (\d+)", source).group(1)) == GATED_ACT_ROUND
    invocations = pipeline_stats.workgroup_size(VARIANTS["reduce_gated_split_rows"].spv.read_bytes())
    assert invocations == GATED_ROW_WG and act_vec * 4 * invocations == GATED_SPLIT_MAX_ROW
    for intermediate in (1, 6912, 10240, 12288, 15360, 21504, GATED_SPLIT_MAX_ROW):
        vec = gated_row_vec(intermediate)
        assert vec % GATED_ACT_ROUND == 0 and intermediate <= vec * 4 * invocations <= GATED_SPLIT_MAX_ROW


def test_only_the_looping_lm_head_grid_is_capped_by_the_sm_count():
    """grids.py caps a "coop_rows C F loop" grid (matmul_coop_direct.comp, whose workgroups loop over
    the tiles) at ROWS_GROUPS_PER_SM workgroups an SM where the SM count is known, and nothing else:
    matmul_coop.comp's decode tile (int8 / int4 LM heads) needs a workgroup a tile."""
    cfg, tiles = shape_config("4b"), 2049
    for sm_count, expected in ((132, ROWS_GROUPS_PER_SM * 132), (0, tiles), (1000, tiles)):
        grids = DispatchGrids(cfg, 64, sm_count)
        looped, plain, tokens = (grids.offset("coop_rows 1 64 loop", tiles), grids.offset("coop_rows 1 64", tiles),
                                 grids.offset("coop_tokens 2 64", 160))
        counts = grids.counts(1, 1, np.array([127]))
        assert counts[looped // 12].tolist() == [expected, 1, 1]
        assert counts[plain // 12].tolist() == [tiles, 1, 1]
        assert counts[tokens // 12].tolist() == [320, 1, 1]


def test_each_step_replays_the_recording_of_its_kind():
    """recordings.recording_for: steps past the decode tiles' rows "prefill"; decode steps up to
    them "decode" (up to 8 tokens) / "decode_rows" (heads made in attention); other steps without
    prompt tokens "chunked" (no prompt tile), with prompt tokens "small" (+flash where recorded)."""
    modes = recording_modes(True, True, True)
    for tokens, seqs, prompt, rows, expected in ((1, 1, False, 64, "decode"), (8, 8, False, 64, "decode"),
                                                 (9, 9, False, 64, "decode_rows"), (64, 64, False, 64, "decode_rows"),
                                                 (65, 65, False, 64, "prefill"), (128, 128, False, 128, "decode_rows"),
                                                 (129, 129, False, 128, "prefill"), (64, 32, False, 64, "chunked"),
                                                 (40, 20, False, 128, "chunked"), (40, 20, True, 128, "small+flash"),
                                                 (1, 1, True, 64, "small+flash"), (200, 20, True, 128, "prefill+flash")):
        assert recording_for(tokens, seqs, prompt, modes, rows) == expected, (tokens, seqs, prompt, rows)
    assert recording_for(64, 64, False, recording_modes(False, False, False), 64) == "small"  # the portable path


def test_the_decode_tiles_take_steps_up_to_their_rows(monkeypatch):
    """A "coop_tokens C F" grid has C workgroups a 32-row tile and column tile up to F chunked rows
    and none above; F is 128 where every layer matmul has direct tiles (fp16 / int8), else 64."""
    grids = DispatchGrids(shape_config("4b"), 64, 132)
    direct, staged = grids.offset("coop_tokens 4 128", 10) // 12, grids.offset("coop_tokens 4 64", 10) // 12
    for tokens, at_128, at_64 in ((1, 40, 40), (64, 80, 80), (65, 120, 0), (128, 160, 0), (129, 0, 0)):
        counts = grids.counts(tokens, 1, np.arange(tokens))
        assert (counts[direct, :2].prod(), counts[staged, :2].prod()) == (at_128, at_64), tokens
    assert coop_decode_rows(["T16", "T8"]) == COOP_DIRECT_FOLD_ROWS == 128
    assert coop_decode_rows(["T16", "Q4", "T8"]) == coop_decode_rows(["I8"]) == COOP_FOLD_ROWS == 64
    monkeypatch.setenv(WIDE_DECODE_ENV, "0")  # the switch keeps every decode tile at 64
    assert coop_decode_rows(["T16", "T8"]) == COOP_FOLD_ROWS


def test_attention_takes_the_serial_grid_where_its_pairs_fill_the_device(monkeypatch):
    """grids.py: an "attention <group>" grid has a workgroup per (token, kv head) where a step's
    pairs number at least SERIAL_PAIRS_PER_SM an SM (4b: 4 kv heads, 132 SMs: from 66 tokens),
    else one per chunk, T * nkv times the step's most chunks; never where the SM count is unknown
    or the switch is off. attention.comp tells them apart by the size: under 2 T nkv is serial."""
    cfg = shape_config("4b")
    assert SERIAL_PAIRS_PER_SM == 2 and cfg.num_kv_heads == 4
    for sm_count, switch in ((132, "1"), (0, "1"), (132, "0")):
        monkeypatch.setenv(SERIAL_ENV, switch)
        grids = DispatchGrids(cfg, 64, sm_count)
        slot = grids.offset("attention full_attention", cfg.num_kv_heads) // 12
        for tokens in (1, 65, 66, 128, 300):
            positions = np.full(tokens, 100)  # 2 chunks of 64 keys each
            groups = grids.counts(tokens, 1, positions)[slot, :2].prod()
            serial = sm_count and switch == "1" and tokens >= 66
            assert groups == (4 * tokens if serial else 8 * tokens), (sm_count, switch, tokens)
            assert (groups < 2 * 4 * tokens) == bool(serial)


def test_the_chunk_tile_takes_the_chunks_that_are_workgroups_and_the_prefill_tile_the_rest():
    """With the chunk tile (coop_tiles.CHUNK_TILE_ENV) a matmul records two prefill-tile grids:
    "coopchunk" has the K chunks as workgroups up to F chunked rows, "coopfold ... above" one
    workgroup a tile above F, so at any step size exactly one of them has work (both none
    without chunked rows), and together they cover what the one "coopfold" grid does alone."""
    grids = DispatchGrids(shape_config("4b"), 64, 132)
    fold_rows = 13 * 128
    alone = grids.offset(f"coopfold_tokens 16 {fold_rows}", 20) // 12
    chunk = grids.offset(f"coopchunk_tokens 16 {fold_rows}", 20) // 12
    above = grids.offset(f"coopfold_tokens 16 {fold_rows} above", 20) // 12
    for tokens, start in ((1, None), (64, None), (65, None), (159, None), (1664, None), (1665, None), (4096, None),
                          (4096, 0), (4096, 31), (4096, 1700), (200, 199)):
        counts = grids.counts(tokens, 1, np.arange(tokens), prompt_start=start)
        chunked = tokens if start is None else start
        groups = {name: counts[slot, :2].prod() for name, slot in (("alone", alone), ("chunk", chunk), ("above", above))}
        assert groups["chunk"] + groups["above"] == groups["alone"], (tokens, start)
        assert (groups["chunk"] > 0) == (0 < chunked <= fold_rows) and (groups["above"] > 0) == (chunked > fold_rows)


def test_small_prefill_steps_run_each_k_chunk_as_a_workgroup():
    """coop_tiles.coop_fold_rows by hand for the 4b shape on 132 SMs (2 workgroups an SM: 264), and
    the prefill tile's grid (grids.py) on either side of it: K chunks as workgroups up to those rows,
    one workgroup summing them above. With prompt tokens (from `prompt_start` on) the prefill tile
    counts only the rows before them and the prompt tile (a workgroup per 128 rows and column tile)
    the rest."""
    down, gate_up, qkv = (20, 16), (160, 2), (32, 8)  # (128-wide tiles, K chunks)
    assert coop_fold_rows(*down, 132) == 13 * 128  # 13 row tiles x 20 = 260 < 264 workgroups, 14 x 20 are not
    assert coop_fold_rows(*gate_up, 132) == 128 and coop_fold_rows(*qkv, 132) == 8 * 128
    assert coop_fold_rows(20, 1, 132) == coop_fold_rows(2000, 16, 132) == COOP_FOLD_ROWS  # nothing to spread / full
    assert coop_fold_rows(*down, 0) == (2 * COOP_UNKNOWN_SMS - 1) // 20 * 128
    grids = DispatchGrids(shape_config("4b"), 64, 132)
    slot = grids.offset(f"coopfold_tokens 16 {13 * 128}", 20) // 12
    whole = grids.offset("coopwhole", 20) // 12
    for rows, groups in ((1, 20 * 16), (64, 20 * 16), (65, 20 * 16), (159, 2 * 20 * 16), (1664, 13 * 20 * 16),
                         (1665, 14 * 20), (4096, 32 * 20)):
        counts = grids.counts(rows, 1, np.arange(rows))
        assert counts[slot, :2].prod() == groups and counts[whole, :2].prod() == 0, rows
    for tokens, start, groups, prompt_groups in ((4096, 0, 0, 32 * 20), (4096, 31, 20 * 16, 32 * 20),
                                                 (4096, 4000, 32 * 20, 20), (200, 199, 2 * 20 * 16, 20)):
        counts = grids.counts(tokens, 1, np.arange(tokens), prompt_start=start)
        assert counts[slot, :2].prod() == groups and counts[whole, :2].prod() == prompt_groups, (tokens, start)
    # a prompt tile with a 32-row form: that form while the 128-row one has fewer workgroups than SMs
    big, small = grids.offset("coopwhole_big", 32) // 12, grids.offset("coopwhole_small", 32) // 12
    for prompt, big_groups, small_groups in ((128, 0, 4 * 32), (512, 0, 16 * 32), (640, 5 * 32, 0), (4000, 32 * 32, 0), (1, 0, 32)):
        counts = grids.counts(prompt + 7, 1, np.arange(prompt + 7), prompt_start=7)
        assert (counts[big, :2].prod(), counts[small, :2].prod()) == (big_groups, small_groups), prompt
    # the partial sums hold the chunked rows' chunks, then the prompt rows (shaders/partial_rows.glsl):
    # at most the chunks of fold_rows rows and the largest step's rows
    assert coop_partial_floats(512, 2560, 16, 1664) == (512 + 16 * 512) * 2560
    assert coop_partial_floats(8192, 2560, 16, 1664) == (8192 + 16 * 1664) * 2560
    assert coop_partial_floats(8192, 20480, 2, 128) == (8192 + 2 * 128) * 20480
    for max_rows, chunks, fold_rows in ((8192, 16, 1664), (8192, 2, 128), (100, 8, 1024), (3000, 4, 64)):
        pad = lambda m: -(-m // 32) * 32
        used = max((chunks if d <= fold_rows else 1) * pad(d) + pad(max_rows - d) for d in range(max_rows + 1))
        assert used <= coop_partial_floats(max_rows, 1, chunks, fold_rows), (max_rows, chunks, fold_rows)
