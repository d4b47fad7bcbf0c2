"""Experiment: GPTQ on the real 270M (fake-quantized into fp32), asym int4 groups, calibration
from CALIB text; args: MODE GROUP CALIB [INT8_NAMES_REGEX]"""
import sys, re, time, numpy as np
from pathlib import Path
import gemma_batch.backends.cpu as cpu_mod
from gemma_batch.engine.llm import LLM
from gemma_batch.engine.perplexity_report import Settings, Reference, measure
from gemma_batch.model import quant_cache
from gemma_batch.model.checkpoint import Tensor, to_float32
import gemma_batch.engine.llm as llm_mod

MODE, GS, CALIB = sys.argv[1], int(sys.argv[2]), sys.argv[3]
INT8RE = re.compile(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] else None
V1 = "/root/.cache/gemma-batch/gguf/6a459d73e418a88045c46e33e4f7f54b-v1"
def h(x): return x.astype(np.float16).astype(np.float32)

def grid(g):  # g [..., GS] -> scale, low (fp16-rounded) with LS refits
    lo, hi = g.min(-1), g.max(-1)
    s, m = h((hi - lo) / 15), h(lo)
    def codes(s, m): return np.clip(np.rint((g - m[..., None]) / np.where(s == 0, 1, s)[..., None]), 0, 15)
    q = codes(s, m); e = ((q * s[..., None] + m[..., None] - g) ** 2).sum(-1); n = g.shape[-1]
    for _ in range(4):
        Sq, Sqq, Sw, Sqw = q.sum(-1), (q*q).sum(-1), g.sum(-1), (q*g).sum(-1)
        det = n*Sqq - Sq*Sq; ok = det > 0; det = np.where(ok, det, 1)
        s2, m2 = h(np.where(ok, (n*Sqw - Sq*Sw)/det, s)), h(np.where(ok, (Sqq*Sw - Sq*Sqw)/det, m))
        q2 = codes(s2, m2); e2 = ((q2*s2[..., None] + m2[..., None] - g)**2).sum(-1); b = e2 < e
        s, m, e, q = np.where(b, s2, s), np.where(b, m2, m), np.minimum(e, e2), np.where(b[..., None], q2, q)
    return s, m

def rtn(w):
    n, k = w.shape; g = w.reshape(n, -1, GS); s, m = grid(g)
    q = np.clip(np.rint((g - m[..., None]) / np.where(s == 0, 1, s)[..., None]), 0, 15)
    return (q * s[..., None] + m[..., None]).reshape(n, k)

def int8(w, per=32):
    n, k = w.shape; g = w.reshape(n, -1, per)
    s = h(np.abs(g).max(-1, keepdims=True) / 127); s = np.where(s == 0, 1, s)
    return (np.clip(np.rint(g / s), -127, 127) * s).reshape(n, k)

def gptq(w, H, block=128, damp=0.01, actorder=False):
    w = w.astype(np.float64).copy(); n, k = w.shape
    H = H.astype(np.float64).copy()
    dead = np.diag(H) == 0; H[dead, dead] = 1; w[:, dead] = 0
    perm = np.argsort(-np.diag(H)) if actorder else np.arange(k)
    w, H = w[:, perm], H[np.ix_(perm, perm)]
    H += damp * np.mean(np.diag(H)) * np.eye(k)
    L = np.linalg.cholesky(np.linalg.inv(H)).T  # upper: Hinv = L^T L... use chol of inverse, upper
    Hinv = L
    out = np.zeros_like(w)
    # groups defined in original column order: with actorder use static groups computed up front
    if actorder:
        g0 = w[:, np.argsort(perm)].reshape(n, -1, GS).astype(np.float32)
        S, M = grid(g0)  # static groups from the unupdated weights
        gidx = (perm // GS)
    S_cur = M_cur = None
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        W1 = w[:, b0:b1].copy(); Q1 = np.zeros_like(W1); E1 = np.zeros_like(W1)
        Hb = Hinv[b0:b1, b0:b1]
        for j in range(b1 - b0):
            col = b0 + j
            if actorder:
                s, m = S[:, gidx[col]].astype(np.float64), M[:, gidx[col]].astype(np.float64)
            else:
                if col % GS == 0:
                    gw = np.concatenate([W1[:, j:], w[:, b1:]], axis=1)[:, :GS].astype(np.float32)
                    S_cur, M_cur = grid(gw[:, None, :]); S_cur, M_cur = S_cur[:, 0].astype(np.float64), M_cur[:, 0].astype(np.float64)
                s, m = S_cur, M_cur
            x = W1[:, j]
            q = np.clip(np.rint((x - m) / np.where(s == 0, 1, s)), 0, 15) * s + m
            Q1[:, j] = q
            err = (x - q) / Hb[j, j]
            W1[:, j:] -= np.outer(err, Hb[j, j:])
            E1[:, j] = err
        out[:, b0:b1] = Q1
        w[:, b1:] -= E1 @ Hinv[b0:b1, b1:]
    return out[:, np.argsort(perm)].astype(np.float32)

# 1. Hessians from the calibration text with the fp32 model
H = {}
names = {}
orig_mm = cpu_mod.matmul_rows
def hooked(x, w, pool=None):
    nm = names.get(id(w))
    if nm is not None:
        x64 = x.astype(np.float64)
        H[nm] = H.get(nm, 0) + x64.T @ x64
    return orig_mm(x, w, pool)
t = time.time()
llm = LLM(V1, backend="cpu")
for name, w in llm.backend.weights.items():
    if w.ndim == 2 and "embed" not in name: names[id(w)] = name
cpu_mod.matmul_rows = hooked
measure(llm, Path(CALIB), Settings(), None)
cpu_mod.matmul_rows = orig_mm
print("hessians", len(H), f"{time.time()-t:.0f}s", flush=True)
llm.backend.close()

orig = quant_cache.load_converted
def load(checkpoint, fmt, root):
    lw = orig(checkpoint, fmt, None)
    def tensors():
        for name, t in lw.tensors:
            if t.data.ndim == 2:
                w = to_float32(t)
                if "embed" in name or name == "lm_head.weight": w = int8(w)
                elif INT8RE and INT8RE.search(name): w = int8(w)
                elif MODE == "rtn": w = rtn(w)
                else: w = gptq(w, H[name], actorder=(MODE == "gptq-act"))
                t = Tensor("F32", w.astype(np.float32))
            yield name, t
    return type(lw)(tensors(), lw.note)
llm_mod.load_converted = load
t = time.time()
for text, ref in (("sample_data/apache-2.0.txt", "/tmp/exp/ref_apache.json"), ("/tmp/exp/bible.txt", "/tmp/exp/ref_bible.json")):
    llm = LLM(V1, backend="cpu")
    r = measure(llm, Path(text), Settings(), Reference.load(Path(ref)))
    print(MODE, GS, sys.argv[4:] , Path(text).name, f"{100*r['reference']['change']:+.2f}%", r["reference"]["top1_agreement"], f"{time.time()-t:.0f}s", flush=True)
    llm.backend.close()
