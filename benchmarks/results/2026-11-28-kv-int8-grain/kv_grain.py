"""Experiment: int8 KV grain on the real 270M (fake-quantized into fp32 slots)."""
import sys, numpy as np
from pathlib import Path
from gemma_batch.backends import kv_formats
from gemma_batch.engine.llm import LLM
from gemma_batch.engine.perplexity_report import Settings, Reference, measure

GRAIN = int(sys.argv[1])  # values per scale

class FakeInt8(kv_formats.KVStore):
    def __init__(self, kv_dtype, slots, heads, head_dim):
        super().__init__("fp32" if kv_dtype == "int8" else kv_dtype, slots, heads, head_dim)
        self.fake = kv_dtype == "int8"
    def write(self, slots, x):
        if not self.fake:
            return super().write(slots, x)
        t, h, d = x.shape
        g = x.reshape(t, h, d // GRAIN, GRAIN)
        amax = np.abs(g).max(-1, keepdims=True)
        s = np.where(amax > 0, amax / 127, 1).astype(np.float32)
        self.data[slots] = (np.clip(np.rint(g / s), -127, 127) * s).reshape(t, h, d)

import gemma_batch.backends.cpu as cpu
for mod in (kv_formats, cpu):
    if hasattr(mod, "KVStore"): setattr(mod, "KVStore", FakeInt8)
import gemma_batch.backends.cpu_attention as ca
if hasattr(ca, "KVStore"): ca.KVStore = FakeInt8
llm = LLM("gemma-3-270m", backend="cpu", kv_dtype="int8")
r = measure(llm, Path(sys.argv[2]), Settings(), Reference.load(Path(sys.argv[3])))
print(GRAIN, r["perplexity"], r["reference"]["change"], r["reference"]["top1_agreement"], r["reference"]["mean_kl"])
