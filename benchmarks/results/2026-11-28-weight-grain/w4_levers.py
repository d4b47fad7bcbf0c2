"""Experiment: int4 levers on the real 270M, fake-quantized into fp32 (groups of 32 input values).
MODE: sym (shipped: scale = extreme / -8), asym (scale and minimum from min/max), search (asym,
the grid's ends searched for least squared error). The embedding (tied LM head): int8, a scale
per row (EMB=row, shipped) or per 32 (EMB=g32)."""
import sys, numpy as np
from pathlib import Path
from gemma_batch.engine.llm import LLM
from gemma_batch.engine.perplexity_report import Settings, Reference, measure
from gemma_batch.model import quant_cache
from gemma_batch.model.checkpoint import Tensor, to_float32

MODE, EMB = sys.argv[1], sys.argv[2]
GS = 32

def int8(w, per):
    n, k = w.shape
    g = w.reshape(n, -1, per)
    amax = np.abs(g).max(-1, keepdims=True)
    s = np.where(amax > 0, amax / np.float32(127), 1).astype(np.float32)
    return (np.clip(np.rint(g / s), -127, 127) * s).reshape(n, k)

def int4(w):
    n, k = w.shape
    g = w.reshape(n, -1, GS).astype(np.float32)
    if MODE == "sym":
        at = np.abs(g).argmax(-1)[..., None]
        s = np.take_along_axis(g, at, -1) / -8
        s = s.astype(np.float16).astype(np.float32)
        s = np.where(s == 0, 1, s)
        return (np.clip(np.rint(g / s), -8, 7) * s).reshape(n, k)
    lo, hi = g.min(-1, keepdims=True), g.max(-1, keepdims=True)
    def q(lo, hi):
        s = ((hi - lo) / 15).astype(np.float16).astype(np.float32)
        m = lo.astype(np.float16).astype(np.float32)
        s = np.where(s == 0, 1e-8, s)
        return np.clip(np.rint((g - m) / s), 0, 15) * s + m
    best = q(lo, hi)
    if MODE == "search":
        err = ((best - g) ** 2).sum(-1, keepdims=True)
        for a in np.linspace(0, 0.2, 9):
            for b in np.linspace(0, 0.2, 9):
                if a == b == 0:
                    continue
                span = hi - lo
                cand = q(lo + a * span, hi - b * span)
                e = ((cand - g) ** 2).sum(-1, keepdims=True)
                better = e < err
                best = np.where(better, cand, best)
                err = np.where(better, e, err)
    return best.reshape(n, k)

orig = quant_cache.load_converted
def load(checkpoint, fmt, root):
    lw = orig(checkpoint, fmt, None)
    def tensors():
        for name, t in lw.tensors:
            if t.data.ndim == 2:
                w = to_float32(t)
                if name in ("embed_tokens.weight", "lm_head.weight"):
                    w = int8(w, GS if EMB == "g32" else w.shape[1])
                else:
                    w = int4(w)
                t = Tensor("F32", w.astype(np.float32))
            yield name, t
    return type(lw)(tensors(), lw.note)
import gemma_batch.engine.llm as llm_mod
llm_mod.load_converted = load
llm = LLM("gemma-3-270m", backend="cpu")
r = measure(llm, Path(sys.argv[3]), Settings(), Reference.load(Path(sys.argv[4])))
print(MODE, EMB, r["perplexity"], r["reference"]["change"], r["reference"]["top1_agreement"], r["reference"]["mean_kl"])
