"""Thread-safe full X^T X per distinct linear input (q/k/v share one, gate/up one), same windows as qlib."""
import re, sys, time, threading, numpy as np
from pathlib import Path
sys.path.insert(0, "/tmp/exp")
import gemma_batch.backends.cpu as cpu_mod
from gemma_batch.engine.llm import LLM
from gemma_batch.engine.perplexity_report import Settings, measure
from qlib import V1

REP = re.compile(r"(q_proj|gate_proj|o_proj|down_proj)")

def key_of(nm):
    return re.sub(r"(q_proj|k_proj|v_proj)", "qkv", re.sub(r"(gate_proj|up_proj)", "gu", nm))

def collect(calib, out):
    H, R, names = {}, {}, {}
    lock = threading.Lock()
    orig = cpu_mod.matmul_rows
    def hooked(x, w, pool=None):
        nm = names.get(id(w))
        if nm is not None and REP.search(nm):
            x64 = np.asarray(x, np.float64)
            s = x64.T @ x64
            k = key_of(nm)
            with lock:
                H[k] = H.get(k, 0) + s
                R[k] = R.get(k, 0) + x.shape[0]
        return orig(x, w, pool)
    t = time.time()
    llm = LLM(V1, backend="cpu")
    for name, w in llm.backend.weights.items():
        if w.ndim == 2 and "embed" not in name: names[id(w)] = name
    cpu_mod.matmul_rows = hooked
    try:
        rep = measure(llm, Path(calib), Settings(), None)
    finally:
        cpu_mod.matmul_rows = orig
    llm.backend.close()
    want = rep["tokens"] + rep["windows"]
    bad = {k: r for k, r in R.items() if r != want}
    assert not bad, (want, bad)
    keymap = {nm: key_of(nm) for nm in names.values()}
    np.save(out, {"H": {k: v.astype(np.float32) for k, v in H.items()}, "map": keymap}, allow_pickle=True)
    print(f"H {calib} -> {out}: {len(H)} inputs, {want} rows, {time.time()-t:.0f}s", flush=True)

if __name__ == "__main__":
    collect(sys.argv[1], sys.argv[2])
