"""AWQ-style input-channel scales before the weighted int4 grid, on the real 270M (fake-quantized).
python awq.py HESS LABEL:SPEC ...   SPEC: 'search' (alpha per input group by H-error, grid 0..1/0.1),
'alpha=A' (one alpha everywhere), 'none' (alpha 0: the shipped weighted grid)."""
import sys, re, time, numpy as np
sys.path.insert(0, "/tmp/exp")
from qlib import load_hessians, fp32_weights, evaluate
from gemma_batch.model.quant import quantize, WeightFormat

FMT = WeightFormat.parse("int4", 32)
H = load_hessians(sys.argv[1])
W = fp32_weights()
ALPHAS = [round(0.1 * i, 1) for i in range(11)]


def fq(w, d, s):
    """W_eff = Q(W diag(s)) diag(1/s), the grid weighted by the scaled inputs' mean squares d / s^2."""
    q = quantize(w * s[None, :], FMT, (d / s ** 2).astype(np.float32))
    return q.dequantize() / s[None, :]


def err(w, we, h):
    e = (w - we).astype(np.float64)
    return float(np.sum((e @ h) * e))


def scales(d, alpha, heads=1):
    """s = d^(alpha/2) (d: channel mean squares), shared over `heads` blocks, normalised to geometric mean 1."""
    if heads > 1:
        d = np.tile(d.reshape(heads, -1).mean(axis=0), heads)
    s = np.maximum(d, 1e-12) ** (alpha / 2)
    return (s / np.exp(np.mean(np.log(s)))).astype(np.float32)


GROUPS = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o": ("self_attn.o_proj",),
          "gu": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}
for spec in sys.argv[2:]:
    label, _, how = spec.partition(":")
    t = time.time(); Q = {}; chosen = {}
    for layer in range(18):
        for g, mats in GROUPS.items():
            names = [f"layers.{layer}.{m}.weight" for m in mats]
            h = H[names[0]]
            d = np.diag(h).astype(np.float64)
            heads = 4 if g == "o" else 1
            alphas = ALPHAS if how == "search" else [0.0] if how == "none" else [float(how.split("=")[1])]
            best = None
            for a in alphas:
                s = scales(d, a, heads)
                we = {n: fq(W[n], d, s) for n in names}
                e = sum(err(W[n], we[n], H[n]) for n in names)
                if best is None or e < best[0]:
                    best = (e, a, we)
            chosen.setdefault(g, []).append(best[1])
            Q.update(best[2])
    qt = time.time() - t
    extra = " ".join(f"{g}:{np.mean(v):.2f}" for g, v in chosen.items())
    print(label, "alphas", {g: v for g, v in chosen.items()}, flush=True)
    evaluate(label, Q, 5.0, qt, "mean alpha " + extra)
