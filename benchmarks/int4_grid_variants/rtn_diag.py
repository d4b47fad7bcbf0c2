"""python rtn_diag.py LABEL=FILE1[,FILE2...] [LABEL=...]  (FILE: a diag file of diaglib or a full H_*.npy; 'none' = unweighted)
Exactly run.py's `rtn:wgrid=h` (all linear matrices int4 g32 with grid weighted by diag(H), embedding int8/32 in
evaluate), with d taken from the files; relerr is the diag-weighted relative error (not the full-H one run.py prints)."""
import sys, re, time, numpy as np
sys.path.insert(0, "/tmp/exp")
from qlib import rtn, fp32_weights, evaluate, bits_of, kind
from diaglib import load_diag

import os
SEARCH = int(os.environ.get("SEARCH", "0"))
W = fp32_weights()
for arg in sys.argv[1:]:
    label, _, files = arg.partition("=")
    paths = files.split(",")
    Dg = None if paths == ["none"] else load_diag(*paths)
    t = time.time(); Q = {}; nb = nw = 0; errs = {}
    for nm, w in W.items():
        if "embed" in nm or nm == "lm_head.weight": continue
        d = None if Dg is None else Dg[nm]
        Q[nm] = rtn(w, 32, d, SEARCH)[0]
        nb += bits_of("int4g32") * w.size; nw += w.size
        if d is not None:
            D = (w - Q[nm]).astype(np.float64); errs[nm] = float((D * D * d).sum() / ((w.astype(np.float64) ** 2) * d).sum())
    qt = time.time() - t
    bykind = {}
    for nm, e in errs.items(): bykind.setdefault(kind(nm), []).append(e)
    extra = ("diag-relerr " + " ".join(f"{k[:-5]}={np.mean(v):.4f}" for k, v in sorted(bykind.items()))) if errs else ""
    tag = "+".join(p.split("/")[-1].replace(".npy", "") for p in paths)
    evaluate(f"rtn:wgrid=h {label} [{tag}]", Q, nb / nw, qt, extra)
