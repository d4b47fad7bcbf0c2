"""int4 recipe experiments on the real Gemma 3 270M (fake-quantized into fp32).
Hessians cached to disk; quantized weights built once per variant; both texts measured."""
import sys, re, time, json, numpy as np
from pathlib import Path
import gemma_batch.backends.cpu as cpu_mod
from gemma_batch.engine.llm import LLM
from gemma_batch.engine.perplexity_report import Settings, Reference, measure
from gemma_batch.model import quant_cache
from gemma_batch.model.checkpoint import Tensor, to_float32
import gemma_batch.engine.llm as llm_mod

V1 = "/root/.cache/gemma-batch/gguf/6a459d73e418a88045c46e33e4f7f54b-v1"
TEXTS = (("/work/main/sample_data/apache-2.0.txt", "/tmp/exp/ref_apache.json"), ("/tmp/exp/bible.txt", "/tmp/exp/ref_bible.json"))
LOG = "/tmp/exp/results.log"


def h(x): return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


# ---------------------------------------------------------------- Hessians
def collect_hessians(calib, out):
    H, names = {}, {}
    last = [None, None]  # (x, its X^T X) shared by q/k/v and by gate/up
    orig_mm = cpu_mod.matmul_rows
    def hooked(x, w, pool=None):
        nm = names.get(id(w))
        if nm is not None:
            if last[0] is not x:
                x32 = np.ascontiguousarray(x, np.float32)
                last[0], last[1] = x, (x32.T @ x32).astype(np.float64)
            H[nm] = H.get(nm, 0) + last[1]
        return orig_mm(x, w, pool)
    t = time.time()
    llm = LLM(V1, backend="cpu")
    for name, w in llm.backend.weights.items():
        if w.ndim == 2 and "embed" not in name: names[id(w)] = name
    cpu_mod.matmul_rows = hooked
    try:
        measure(llm, Path(calib), Settings(), None)
    finally:
        cpu_mod.matmul_rows = orig_mm
    llm.backend.close()
    # store each distinct input's Hessian once (q/k/v share one, gate/up one)
    uniq, keymap = {}, {}
    for nm, a in H.items():
        layer = nm.rsplit(".", 3)[0] if False else nm
        key = re.sub(r"(q_proj|k_proj|v_proj)", "qkv", re.sub(r"(gate_proj|up_proj)", "gu", nm))
        uniq.setdefault(key, a.astype(np.float32)); keymap[nm] = key
    np.save(out, {"H": uniq, "map": keymap}, allow_pickle=True)
    print("hessians", len(H), len(uniq), f"{time.time()-t:.0f}s", flush=True)


def load_hessians(*paths):
    tot = None
    for p in paths:
        d = np.load(p, allow_pickle=True).item()
        if tot is None:
            tot = {k: v.astype(np.float64) for k, v in d["H"].items()}; keymap = d["map"]
        else:
            for k, v in d["H"].items(): tot[k] += v
    return {nm: tot[key] for nm, key in keymap.items()}


# ---------------------------------------------------------------- grids
def _codes(g, s, m):
    return np.clip(np.rint((g - m[..., None]) / np.where(s == 0, 1, s)[..., None]), 0, 15)


def grid(g, d=None, search=0, refits=4):
    """g [..., G] -> fp16 scale, min minimising sum_j d_j (q_j s + m - g_j)^2 (d None: unweighted).
    search: also try shrinking the range ends by fractions of it (small grid), keep the best."""
    if d is None: d = np.ones_like(g)
    d = np.broadcast_to(d, g.shape).astype(np.float64); g64 = g.astype(np.float64)
    lo, hi = g64.min(-1), g64.max(-1)
    def err(s, m):
        q = _codes(g64, s, m); return ((q * s[..., None] + m[..., None] - g64) ** 2 * d).sum(-1), q
    s, m = h((hi - lo) / 15).astype(np.float64), h(lo).astype(np.float64)
    e, q = err(s, m)
    if search:
        fr = np.linspace(0, 0.2, search + 1)[1:]
        for a in np.concatenate([[0], fr]):
            for b in np.concatenate([[0], fr]):
                if a == 0 and b == 0: continue
                l2, h2 = lo + a * (hi - lo), hi - b * (hi - lo)
                s2, m2 = h((h2 - l2) / 15).astype(np.float64), h(l2).astype(np.float64)
                e2, q2 = err(s2, m2); bb = e2 < e
                s, m, e, q = np.where(bb, s2, s), np.where(bb, m2, m), np.where(bb, e2, e), np.where(bb[..., None], q2, q)
    for _ in range(refits):
        Sd, Sq, Sqq, Sw, Sqw = d.sum(-1), (d*q).sum(-1), (d*q*q).sum(-1), (d*g64).sum(-1), (d*q*g64).sum(-1)
        det = Sd*Sqq - Sq*Sq; ok = det > 1e-30 * np.maximum(Sd*Sqq, 1e-300); det = np.where(ok, det, 1)
        s2 = h(np.where(ok, (Sd*Sqw - Sq*Sw)/det, s)).astype(np.float64)
        m2 = h(np.where(ok, (Sqq*Sw - Sq*Sqw)/det, m)).astype(np.float64)
        e2, q2 = err(s2, m2); bb = e2 < e
        s, m, e, q = np.where(bb, s2, s), np.where(bb, m2, m), np.where(bb, e2, e), np.where(bb[..., None], q2, q)
    return s, m


def rtn(w, G, d=None, search=0):
    n, k = w.shape; g = w.reshape(n, -1, G)
    dd = None if d is None else (d.reshape(1, -1, G) if d.ndim == 1 else d.reshape(n, -1, G))
    s, m = grid(g, dd, search)
    q = _codes(g, s, m)
    return (q * s[..., None] + m[..., None]).reshape(n, k).astype(np.float32), q.reshape(n, k), s, m


def int8(w, per=32):
    n, k = w.shape; g = w.reshape(n, -1, per)
    s = h(np.abs(g).max(-1, keepdims=True) / 127); s = np.where(s == 0, 1, s)
    return (np.clip(np.rint(g / s), -127, 127) * s).reshape(n, k).astype(np.float32)


# ---------------------------------------------------------------- GPTQ
def gptq(w, H, G, block=128, damp=0.01, actorder=False, wgrid=None, search=0):
    """Asymmetric int4 GPTQ; returns (dequantized fp32, codes, S, M) in original column order.
    wgrid: None (unweighted grid), 'h' (diag H), 'hinv' (1/[chol(Hinv)]_jj^2, GPTQ's own column cost)."""
    w = w.astype(np.float64).copy(); n, k = w.shape
    H = H.astype(np.float64).copy()
    dead = np.diag(H) == 0; H[dead, dead] = 1; w[:, dead] = 0
    H += damp * np.mean(np.diag(H)) * np.eye(k)
    perm = np.argsort(-np.diag(H), kind="stable") if actorder else np.arange(k)
    inv = np.argsort(perm)
    w, Hp = w[:, perm], H[np.ix_(perm, perm)]
    U = np.linalg.cholesky(np.linalg.inv(Hp)).T  # upper
    dcol_p = {None: np.ones(k), "h": np.diag(Hp), "hinv": 1 / np.diag(U) ** 2}[wgrid]
    out = np.zeros_like(w); codes = np.zeros_like(w)
    ng = k // G; S = np.zeros((n, ng)); M = np.zeros((n, ng))
    if actorder:  # static groups from the unupdated weights, weighted in original order
        worig = w[:, inv]; dorig = dcol_p[inv]
        S, M = grid(worig.reshape(n, ng, G), dorig.reshape(1, ng, G), search)
        gidx = perm // G
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        W1 = w[:, b0:b1].copy(); E1 = np.zeros_like(W1)
        Ub = U[b0:b1, b0:b1]
        for j in range(b1 - b0):
            col = b0 + j
            if actorder:
                gi = gidx[col]; s, m = S[:, gi], M[:, gi]
            else:
                gi = col // G
                if col % G == 0:
                    gw = np.concatenate([W1[:, j:], w[:, b1:]], axis=1)[:, :G]
                    s_, m_ = grid(gw[:, None, :], dcol_p[col:col + G][None, None, :], search)
                    S[:, gi], M[:, gi] = s_[:, 0], m_[:, 0]
                s, m = S[:, gi], M[:, gi]
            x = W1[:, j]
            c = np.clip(np.rint((x - m) / np.where(s == 0, 1, s)), 0, 15)
            q = c * s + m
            out[:, col] = q; codes[:, col] = c
            err = (x - q) / Ub[j, j]
            W1[:, j:] -= np.outer(err, Ub[j, j:])
            E1[:, j] = err
        w[:, b1:] -= E1 @ U[b0:b1, b1:]
    return out[:, inv].astype(np.float32), codes[:, inv], S, M


def refit_h(w, H, codes, S, M, G, ridge=1e-6):
    """Codes fixed: per row, the fp16 (s, m) of every group minimising (w - Q) H (w - Q)^T."""
    n, k = w.shape; ng = k // G
    w = w.astype(np.float64); H = H.astype(np.float64)
    Hr = H.reshape(ng, G, ng, G)
    Amm = Hr.sum(axis=(1, 3))  # [ng, ng]
    out = np.empty((n, k), np.float32); S2 = np.empty((n, ng)); M2 = np.empty((n, ng))
    for r0 in range(0, n, 64):
        q = codes[r0:r0 + 64].reshape(-1, ng, G); R = q.shape[0]
        HQ = np.empty((R, k, ng))
        for hh in range(ng): HQ[:, :, hh] = q[:, hh, :] @ H[hh * G:(hh + 1) * G, :]  # H symmetric
        Ass = np.einsum("rgi,rgih->rgh", q, HQ.reshape(R, ng, G, ng))
        Ams = HQ.reshape(R, ng, G, ng).sum(2)  # [R, g(ones), h(q)] = 1_g^T H q_h
        Hw = (w[r0:r0 + R] @ H).reshape(R, ng, G)
        bs = (q * Hw).sum(-1); bm = Hw.sum(-1)
        A = np.zeros((R, 2 * ng, 2 * ng))
        A[:, :ng, :ng] = Ass; A[:, ng:, ng:] = Amm; A[:, ng:, :ng] = Ams; A[:, :ng, ng:] = Ams.transpose(0, 2, 1)
        tr = np.trace(A, axis1=1, axis2=2) / (2 * ng)
        A += ridge * tr[:, None, None] * np.eye(2 * ng)
        b = np.concatenate([bs, bm], 1)
        th = np.linalg.solve(A, b[..., None])[..., 0]
        s, m = h(th[:, :ng]).astype(np.float64), h(th[:, ng:]).astype(np.float64)
        Q = (q * s[..., None] + m[..., None]).reshape(R, k)
        Q0 = (q * S[r0:r0 + R, :, None] + M[r0:r0 + R, :, None]).reshape(R, k)
        # keep per row whichever is better in the H metric
        def obj(Qx):
            D = w[r0:r0 + R] - Qx; return ((D @ H) * D).sum(1)
        better = obj(Q) < obj(Q0)
        out[r0:r0 + R] = np.where(better[:, None], Q, Q0)
        S2[r0:r0 + R] = np.where(better[:, None], s, S[r0:r0 + R]); M2[r0:r0 + R] = np.where(better[:, None], m, M[r0:r0 + R])
    return out, S2, M2


def rel_err(w, Q, H):
    D = (w - Q).astype(np.float64); W = w.astype(np.float64)
    return float(((D @ H) * D).sum() / ((W @ H) * W).sum())


# ---------------------------------------------------------------- weights and measuring
def fp32_weights():
    from gemma_batch.model.sources import open_model
    from gemma_batch.model.quant import WeightFormat
    _, _, _, ck = open_model(V1, sys.stderr)
    lw = quant_cache.load_converted(ck, WeightFormat.parse("auto", 32), None)
    return {name: to_float32(t).copy() for name, t in lw.tensors if t.data.ndim == 2}


def bits_of(fmt):
    if fmt == "int8": return 8.5
    return 4 + 32 / int(fmt[5:])  # "int4gG": fp16 scale + fp16 min per G


def evaluate(name, Q, bits, qtime, extra=""):
    """Q: name -> fp32 (quantized) matrices for every linear layer; the embedding int8 per 32."""
    orig = quant_cache.load_converted
    def load(checkpoint, fmt, root, calibration=None):
        lw = orig(checkpoint, fmt, None)
        def tensors():
            for nm, t in lw.tensors:
                if t.data.ndim == 2:
                    w = Q[nm] if nm in Q else int8(to_float32(t))
                    t = Tensor("F32", np.ascontiguousarray(w, np.float32))
                yield nm, t
        return type(lw)(tensors(), lw.note)
    llm_mod.load_converted = load
    res = []
    t = time.time()
    try:
        for text, ref in TEXTS:
            llm = LLM(V1, backend="cpu")
            r = measure(llm, Path(text), Settings(), Reference.load(Path(ref)))
            res.append((100 * r["reference"]["change"], 100 * r["reference"]["top1_agreement"]))
            llm.backend.close()
    finally:
        llm_mod.load_converted = orig
    line = (f"{name:48s} bits {bits:.4f}  apache {res[0][0]:+6.2f}% top1 {res[0][1]:.1f}  bible {res[1][0]:+6.2f}% "
            f"top1 {res[1][1]:.1f}  quant {qtime:.0f}s eval {time.time()-t:.0f}s {extra}")
    print(line, flush=True)
    with open(LOG, "a") as f: f.write(line + "\n")
    return res


def kind(nm):
    return re.search(r"(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)", nm).group(1)
