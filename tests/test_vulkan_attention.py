"""attention.comp's QK_IN variant (decode steps on the cooperative path) against the two kernels it
replaces, and its serial grid (a workgroup per token and kv head taking the token's chunks in
turn) against a workgroup per chunk, bit for bit, on any Vulkan device (llvmpipe in CI).

In a decode step the graph leaves out qkv's reduce (reduce.comp EPI_QK_ROPE: the K chunks' sums,
QK-norm, RoPE, q out and the token's K and V rows into the pages) and attention makes its heads
from the chunk sums itself. A token's output must not depend on which path ran (batch
invariance: the same token goes the long way in a step that mixes prefill and decode), so the
attention output, the o projection's split and scale, and every byte of the K and V pages must
be equal to those of reduce_qk_rope_<kv> followed by attention_<kv>_split.
"""

from __future__ import annotations

import numpy as np
import pytest

from gemma_batch.backends.kv_formats import bf16_round, kv_int8_group
from gemma_batch.backends.vulkan.attention import most_chunks
from gemma_batch.backends.vulkan.coop_tiles import COOP_FOLD_ROWS
from tests.step_logits import assert_same_logits, keep_logits
from tests.vulkan_dispatch import Dispatches

BLOCK, CHUNK, EPS = 16, 16, 1e-6  # chunks of 16 keys: tokens merge several


def page_bytes(kv: str, rows: int, hd: int, rng) -> np.ndarray:
    """Random K or V pages of `rows` rows (slot * nkv + head) in the layout of kv_pages.glsl."""
    x = rng.standard_normal((rows, hd)).astype(np.float32)
    if kv == "float32":
        return x.view(np.uint8)
    if kv == "float16":
        return x.astype(np.float16).view(np.uint8)
    if kv == "bfloat16":
        return bf16_round(x).view(np.uint8)
    codes = rng.integers(-127, 128, (rows, hd)).astype(np.int8).view(np.uint32)  # int8: codes, then a scale a group
    scales = (0.03 * 2.0 ** rng.integers(-2, 3, (rows, hd // kv_int8_group(hd)))).astype(np.float32)
    return np.concatenate([codes, scales.view(np.uint32)], axis=1).view(np.uint8)


def run(fused: bool, kv: str, nh: int, nkv: int, hd: int, window: int, chunks: int, seed: int,
        gmax: int | None = None, specialize: bool = False, serial: bool = False) -> dict[str, np.ndarray]:
    """One decode step of T = 3 tokens (3 sequences) at positions 5, 40 and 77: reduce_qk_rope and
    attention_<kv>_split, or attention_<kv>_split_qk alone (`specialize`: its sizes built into the
    pipeline, as the graph records it), attention over the serial grid (`serial`: T * nkv
    workgroups) or a workgroup per chunk; its outputs and the pages after it.
    `gmax`: attention's GMAX (Kernels' kv_group), the model's query heads per kv head unless given."""
    rng = np.random.default_rng(seed)
    T, N, G = 3, (nh + 2 * nkv) * hd, nh // nkv
    positions = np.array([5, 40, 77], np.int32)
    width = 8  # blocks per sequence: positions up to 127
    table = rng.permutation(T * width).astype(np.int32).reshape(T, width)
    slots = (table[np.arange(T), positions // BLOCK] * BLOCK + positions % BLOCK).astype(np.int32)
    rows = T * width * BLOCK * nkv
    arrays = {
        "partial": (rng.standard_normal((chunks, 32, N)) * 40).astype(np.float32),
        "scale": (np.float32(2.0) ** rng.integers(-10, -4, T)).astype(np.float32),
        "qk_norm": (rng.standard_normal(2 * hd) * 0.5).astype(np.float32),
        "inv_freq": (10000.0 ** (-np.arange(0, hd, 2) / hd)).astype(np.float32),
        "positions": positions, "token_seq": np.arange(T, dtype=np.int32), "table": table, "slots": slots,
        "k": page_bytes(kv, rows, hd, rng), "v": page_bytes(kv, rows, hd, rng),
    }
    with Dispatches(tokens=T, seqs=T, kv_group=gmax or G) as d:
        bufs = {name: d.upload(a, name) for name, a in arrays.items()}
        most = most_chunks(positions, window or None, CHUNK)
        for name, size in [("q", T * nh * hd), ("y", 32 * N), ("attn", T * nh * hd), ("split", T * nh * hd),  # (fp16 pairs)
                           ("part_acc", most * T * nh * hd), ("part_ml", most * T * 2 * nh)]:
            bufs[name] = d.alloc(4 * size, name)
        bufs["counters"] = d.upload(np.zeros(T * nkv + T, np.uint32), "counters")
        heads = {"num_heads": nh, "num_kv_heads": nkv, "head_dim": hd}
        if not fused:
            d.dispatch(f"reduce_qk_rope_{kv}", {
                0: bufs["partial"], 2: bufs["y"], 4: bufs["scale"], 9: bufs["qk_norm"], 10: bufs["q"],
                11: bufs["positions"], 12: bufs["inv_freq"], 13: bufs["slots"], 14: bufs["k"], 15: bufs["v"]},
                {"N": N, "chunks": chunks, "fold_rows": COOP_FOLD_ROWS, "eps": EPS, **heads}, T * (nh + 2 * nkv))
        inputs = ({0: bufs["partial"], 13: bufs["qk_norm"], 14: bufs["inv_freq"], 15: bufs["slots"]} if fused
                  else {0: bufs["q"]})
        d.dispatch(f"attention_{kv}_split{'_qk' if fused else ''}", {
            **inputs, 1: bufs["attn"], 2: bufs["positions"], 3: bufs["token_seq"], 4: bufs["table"], 5: bufs["part_acc"],
            6: bufs["k"], 8: bufs["v"], 9: bufs["part_ml"], 10: bufs["counters"], 11: bufs["split"],
            12: bufs["scale"]},
            {**heads, "window": window, "block_size": BLOCK, "table_stride": width, "chunk": CHUNK,
             "scale": hd ** -0.5, "qkv_chunks": chunks if fused else 0, "eps": EPS}, (1 if serial else most) * T * nkv,
            specialize)
        d.run()
        assert any("@" in key for key in d.kernels.pipelines) == specialize  # (a pipeline of its own)
        out = {name: d.download(bufs[name]) for name in ("attn", "split", "scale", "k", "v", "counters")}
        out["k before"], out["v before"] = arrays["k"], arrays["v"]
        return out


# (kv dtype, query heads, kv heads, head_dim, window, qkv's K chunks, attention's GMAX or None)
CASES = [
    ("float16", 8, 4, 256, 0, 8, None),  # the 4b model's heads, qkv's 8 chunks
    ("int8", 4, 1, 64, 24, 3, None),     # 4 query heads a kv head (the 1b's), a sliding window
    ("float32", 2, 1, 128, 0, 11, None),  # more chunks than one round of loads (SUM_LOADS = 8)
    ("bfloat16", 2, 2, 32, 40, 1, 4),    # a pipeline built for more query heads than the model has
]


@pytest.mark.parametrize("kv,nh,nkv,hd,window,chunks,gmax", CASES)
@pytest.mark.parametrize("specialize", [False, True])
def test_attention_makes_its_heads_as_the_reduce_would(kv, nh, nkv, hd, window, chunks, gmax, specialize):
    ref = run(False, kv, nh, nkv, hd, window, chunks, seed=hd + chunks, gmax=gmax)
    got = run(True, kv, nh, nkv, hd, window, chunks, seed=hd + chunks, gmax=gmax, specialize=specialize)
    differ = [name for name in ("attn", "split", "scale", "k", "v") if not np.array_equal(got[name], ref[name])]
    assert not differ, f"{differ} differ"
    assert not got["counters"].any()  # the merges and the split reset them for the next layer
    for name in ("k", "v"):  # the step wrote its own rows, 3 tokens x nkv, and no other
        before = got[f"{name} before"]
        changed = (got[name].reshape(before.shape) != before).any(axis=1).sum()
        assert changed == 3 * nkv, name


@pytest.mark.parametrize("kv,nh,nkv,hd,window,chunks,gmax", CASES)
@pytest.mark.parametrize("fused", [False, True])
def test_the_serial_grid_gives_the_chunked_grids_bits(kv, nh, nkv, hd, window, chunks, gmax, fused):
    """A workgroup per (token, kv head) taking the token's chunks in turn (grids.py, where a step's
    pairs fill the device; the shader knows it by the grid's size) against a workgroup per chunk,
    with the query heads read (attention_<kv>_split) or made (_split_qk): the same outputs, split,
    pages, and counters left at zero. The tokens at positions 40 and 77 have 3 and 5 chunks of 16
    keys (fewer within the windows)."""
    ref = run(fused, kv, nh, nkv, hd, window, chunks, seed=hd + chunks, gmax=gmax, specialize=fused)
    got = run(fused, kv, nh, nkv, hd, window, chunks, seed=hd + chunks, gmax=gmax, specialize=fused, serial=True)
    differ = [name for name in ("attn", "split", "scale", "k", "v") if not np.array_equal(got[name], ref[name])]
    assert not differ, f"{differ} differ"
    assert not got["counters"].any()


def test_a_model_gives_the_same_logits_on_either_attention_grid(monkeypatch):
    """The demo model end to end (its prompts' 64-token steps and decode steps; on the cooperative
    path the decode recordings' _split_qk too), with every step's attention on the serial grid
    (forced: the SM count decides it, and llvmpipe gives none) and on a workgroup per chunk:
    identical logits. Prompts of 70-140 tokens: 2 or 3 chunks of 64 keys."""
    from gemma_batch.backends.vulkan import VulkanBackend, grids
    from gemma_batch.engine.generate import generate_greedy
    from gemma_batch.job.spec import DEMO_MODEL
    from gemma_batch.model.checkpoint import Checkpoint
    from gemma_batch.model.config import Gemma3Config

    cfg = Gemma3Config.from_dir(DEMO_MODEL)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, cfg.vocab_size, int(n)).tolist() for n in (70, 100, 128, 140)]
    runs = []
    for serial in (True, False):
        rows: dict = {}
        with monkeypatch.context() as patch:
            patch.setattr(grids, "serial_grid", lambda pairs, sm_count, allowed, serial=serial: serial)
            backend = VulkanBackend(cfg, kv_dtype="fp16")
            backend.load_weights(Checkpoint.open(DEMO_MODEL, cfg).tensors())
            generate_greedy(backend, prompts, 3, step_token_budget=64,
                            on_step=lambda ids, batch, result, rows=rows: keep_logits(rows, ids, batch, result))
            backend.close()
        runs.append(rows)
    assert_same_logits(runs[0], runs[1])
