"""How alike two calibration sources' diag(H) are: per matrix, correlation of log diag, and the spread of
the ratio within 32-channel groups (the only thing the weighted grid sees), median over matrices."""
import sys, numpy as np
sys.path.insert(0, "/tmp/exp"); from diaglib import load_diag
src = {a.split("=")[0]: load_diag(*a.split("=")[1].split(",")) for a in sys.argv[1:]}
ks = list(src); base = src[ks[0]]
for k in ks[1:]:
    o = src[k]; cs, sp = [], []
    for nm in base:
        a, b = np.log(base[nm] + 1e-30), np.log(o[nm] + 1e-30)
        cs.append(np.corrcoef(a, b)[0, 1])
        r = (a - b).reshape(-1, 32); sp.append(np.median(r.std(1)))
    print(f"{ks[0]} vs {k}: corr(log diag) median {np.median(cs):.4f} min {np.min(cs):.4f}; within-group std of log ratio, median {np.median(sp):.3f} max {np.max(sp):.3f}")
