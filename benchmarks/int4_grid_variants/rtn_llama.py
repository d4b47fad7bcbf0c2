"""weighted grid with llama.cpp's Q4_K imatrix weighting: d[n,k] = imatrix[k] * sqrt(sigma2[n] + w[n,k]^2), sigma2 = 2 mean(w_row^2)."""
import sys, time, os, numpy as np
sys.path.insert(0, "/tmp/exp")
from qlib import rtn, fp32_weights, evaluate, bits_of
from diaglib import load_diag
W = fp32_weights()
label, _, files = sys.argv[1].partition("=")
Dg = load_diag(*files.split(","))
mode = os.environ.get("MODE", "llama")
t = time.time(); Q = {}
for nm, w in W.items():
    if "embed" in nm or nm == "lm_head.weight": continue
    d = Dg[nm][None, :].astype(np.float64)
    if mode == "llama":
        sigma2 = 2 * (w.astype(np.float64) ** 2).mean(1, keepdims=True)
        d = d * np.sqrt(sigma2 + w.astype(np.float64) ** 2)
    elif mode == "sqrt":
        d = np.sqrt(d) * np.ones_like(w, dtype=np.float64)
    else:
        d = d * np.ones_like(w, dtype=np.float64)
    Q[nm] = rtn(w, 32, d, 0)[0]
evaluate(f"rtn weighted {mode} {label}", Q, 5.0, time.time() - t)
