"""Bit-for-bit check of experimental attention builds against attn_base.spv: every step's
attention output, the o projection's split and scale, and the logits, in a batched run with
prefill in 7-token chunks and 4-key chunks (several chunks per token). Shapes: the demo model
(G 4, hd 64) and a 2-layer 4b-like random model (G 2, hd 256, vocab cut).
usage: check.py NAME... (attn_NAME.spv in this folder; the first is the reference)"""
import sys
from pathlib import Path
import numpy as np
from common import file_variant, models
from gemma_batch.backends.vulkan import VulkanBackend, kernels as Kmod
from gemma_batch.backends.vulkan.graph import StepGraph
from gemma_batch.engine.generate import generate_greedy

HERE = Path(__file__).resolve().parent
NAMES = sys.argv[1:]


def run(cfg, tensors, name, chunk):
    backend = VulkanBackend(cfg, attention_chunk=chunk)
    backend.load_weights(tensors())
    native = backend.kernels.x_lo is not None if hasattr(backend.kernels, "x_lo") else False
    T_MAX = 64
    split = backend.mem.alloc(4 * T_MAX * cfg.q_width, "test split")
    scale = backend.mem.alloc(4 * T_MAX, "test split scale")
    orig = StepGraph._dispatch
    def dispatch(self, n, buffers, push, grid):
        if n.startswith("attention_"):
            if not n.endswith("_split"):
                n, buffers = f"{n}_split", {**buffers, 11: split, 12: scale}
            Kmod.VARIANTS[n] = file_variant(n, "attention", HERE / f"attn_{name}.spv")
            self.kernels.pipelines.pop(n, None)
        orig(self, n, buffers, push, grid)
    StepGraph._dispatch = dispatch
    out = []
    def on_step(idx, batch, result):
        T = len(batch.positions)
        attn = backend.mem.download(backend.buffers.attn).view(np.uint32)[:T * cfg.q_width].copy()
        if not any(n.endswith("_split") for n in []):
            sp = backend.mem.download(split).view(np.uint32)[:T * cfg.q_width].copy()
            sc = backend.mem.download(scale).view(np.uint32)[:T].copy()
        out.append((T, attn, sp, sc, np.asarray(result.logits).view(np.uint32).copy()))
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(3, cfg.vocab_size, n)) for n in (3, 40, 9, 77, 20)]
    try:
        comp = generate_greedy(backend, prompts, 24, step_token_budget=7, on_step=on_step)
    finally:
        StepGraph._dispatch = orig
    return comp, out

ok = True
for mname, cfg, tensors in models():
    for chunk in (4, 64):
        ref = None
        for name in NAMES:
            comp, out = run(cfg, tensors, name, chunk)
            if ref is None:
                ref = (comp, out); print(f"{mname} chunk {chunk} {name}: {len(out)} steps (reference)", flush=True); continue
            same = comp == ref[0] and len(out) == len(ref[1]) and all(
                all(np.array_equal(a, b) for a, b in zip(x[1:], y[1:])) for x, y in zip(out, ref[1]))
            bad = [i for i, (x, y) in enumerate(zip(out, ref[1])) if not all(np.array_equal(a, b) for a, b in zip(x[1:], y[1:]))]
            print(f"{mname} chunk {chunk} {name}: {'IDENTICAL' if same else 'DIFFERENT at steps ' + str(bad[:5])}", flush=True)
            ok &= same
print("ALL IDENTICAL" if ok else "SOME DIFFER")
