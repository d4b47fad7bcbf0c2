"""Experiment: int8 weight grain on the real 270M: every matrix fake-quantized (int8 codes, an fp32
scale per group of G input values, G=0: per output row as shipped), dequantized into fp32."""
import sys, numpy as np
from pathlib import Path
from gemma_batch.engine.llm import LLM
from gemma_batch.engine.perplexity_report import Settings, Reference, measure
from gemma_batch.model import quant_cache
from gemma_batch.model.checkpoint import Tensor, to_float32

G = int(sys.argv[1])

def fake(w):
    n, k = w.shape
    g = w.reshape(n, -1, G) if G else w.reshape(n, 1, k)
    amax = np.abs(g).max(-1, keepdims=True)
    s = np.where(amax > 0, amax / np.float32(127), 1).astype(np.float32)
    return (np.clip(np.rint(g / s), -127, 127) * s).reshape(n, k).astype(np.float32)

orig = quant_cache.load_converted
def load(checkpoint, fmt, root):
    lw = orig(checkpoint, fmt, None)
    def tensors():
        for name, t in lw.tensors:
            if t.data.ndim == 2:
                t = Tensor("F32", fake(to_float32(t)))
            yield name, t
    return type(lw)(tensors(), lw.note)
import gemma_batch.engine.llm as llm_mod
llm_mod.load_converted = load
llm = LLM("gemma-3-270m", backend="cpu")
r = measure(llm, Path(sys.argv[2]), Settings(), Reference.load(Path(sys.argv[3])))
print(G, r["perplexity"], r["reference"]["change"], r["reference"]["top1_agreement"], r["reference"]["mean_kl"])
