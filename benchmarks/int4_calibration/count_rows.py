"""Debug: how many rows / calls each hooked matrix sees while measure() runs over a text."""
import sys, collections, numpy as np
from pathlib import Path
sys.path.insert(0, "/tmp/exp")
import gemma_batch.backends.cpu as cpu_mod
from gemma_batch.engine.llm import LLM
from gemma_batch.engine.perplexity_report import Settings, measure
from qlib import V1
rows, calls, shapes = collections.Counter(), collections.Counter(), collections.Counter()
names = {}
orig = cpu_mod.matmul_rows
def hooked(x, w, pool=None):
    nm = names.get(id(w))
    if nm is not None:
        rows[nm] += x.shape[0]; calls[nm] += 1; shapes[(nm, x.shape)] += 1
    return orig(x, w, pool)
llm = LLM(V1, backend="cpu")
for name, w in llm.backend.weights.items():
    if w.ndim == 2 and "embed" not in name: names[id(w)] = name
print("hooked", len(names), "2-D weights", sum(1 for w in llm.backend.weights.values() if w.ndim == 2))
cpu_mod.matmul_rows = hooked
rep = measure(llm, Path(sys.argv[1]), Settings(), None)
print("tokens", rep["tokens"], "windows", rep["windows"])
for nm in list(rows)[:9]: print(nm, "rows", rows[nm], "calls", calls[nm])
print("shapes of layer-0 q:", [(s, c) for (n, s), c in shapes.items() if n == "layers.0.self_attn.q_proj.weight"][:12])
print("distinct row totals:", collections.Counter(rows.values()))
