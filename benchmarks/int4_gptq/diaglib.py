"""Cheap calibration: per linear matrix only diag(X^T X) = each input channel's sum of squares over
the calibration tokens (all that `rtn:wgrid=h` uses), collected with the same hook and the same
windows (measure(), Settings(): 512-token windows, stride 512, <bos> each) as qlib.collect_hessians."""
import re, sys, time, threading, numpy as np
from pathlib import Path
sys.path.insert(0, "/tmp/exp")
import gemma_batch.backends.cpu as cpu_mod
from gemma_batch.engine.llm import LLM
from gemma_batch.engine.perplexity_report import Settings, measure
from qlib import V1


def collect_diag(calib, out):
    """Thread-safe: the CPU backend runs a step's rows in parts on its pool's threads (cpu.py _row_parts),
    so the hook keeps no shared 'last input' and adds under a lock. Each matrix must see every
    token once (tokens + one <bos> a window); checked."""
    D, R, names = {}, {}, {}
    lock = threading.Lock()
    orig_mm = cpu_mod.matmul_rows
    def hooked(x, w, pool=None):
        nm = names.get(id(w))
        if nm is not None:
            x64 = np.asarray(x, np.float64)
            s = np.einsum("ij,ij->j", x64, x64)
            with lock:
                if nm in D: D[nm] += s
                else: D[nm] = s
                R[nm] = R.get(nm, 0) + x.shape[0]
        return orig_mm(x, w, pool)
    t = time.time()
    llm = LLM(V1, backend="cpu")
    for name, w in llm.backend.weights.items():
        if w.ndim == 2 and "embed" not in name: names[id(w)] = name
    cpu_mod.matmul_rows = hooked
    try:
        rep = measure(llm, Path(calib), Settings(), None)
    finally:
        cpu_mod.matmul_rows = orig_mm
    llm.backend.close()
    secs = time.time() - t
    want = rep["tokens"] + rep["windows"]
    bad = {nm: r for nm, r in R.items() if r != want}
    assert len(D) == len(names) and not bad, ("rows seen", want, bad)
    np.save(out, {"d": D, "tokens": rep["tokens"], "windows": rep["windows"], "seconds": secs, "text": str(calib)},
            allow_pickle=True)
    print(f"diag {calib} -> {out}: {len(D)} matrices, each {want} rows = {rep['tokens']} tokens + {rep['windows']} <bos>, {secs:.0f}s", flush=True)


def load_diag(*paths):
    """name -> summed diag over the files; a file is either a diag file of collect_diag or a full
    Hessian file of qlib.collect_hessians (its np.diag taken)."""
    tot = {}
    for p in paths:
        d = np.load(p, allow_pickle=True).item()
        if "d" in d:
            part = d["d"]
        else:
            part = {nm: np.diag(d["H"][key]).astype(np.float64) for nm, key in d["map"].items()}
        for nm, v in part.items(): tot[nm] = tot.get(nm, 0) + np.asarray(v, np.float64)
    return tot


if __name__ == "__main__":
    collect_diag(sys.argv[1], sys.argv[2])
