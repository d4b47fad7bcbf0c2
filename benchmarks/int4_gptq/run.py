"""python run.py HESS1[,HESS2...] SPEC [SPEC ...]
SPEC: method:key=val,... ; keys: G (base group), act, wgrid (none|h|hinv), search, damp, block, refit,
int8=REGEX (matrices int8/32), g32=REGEX / g64=REGEX (group override), name=LABEL, hfree (rtn uses no H)
Quantized matrices are cached within the process by (name, method, G, options)."""
import sys, re, time, json, numpy as np
sys.path.insert(0, "/tmp/exp")
from qlib import *

hpaths = sys.argv[1].split(",")
t = time.time()
H = load_hessians(*hpaths) if hpaths != ["none"] else None
W = fp32_weights()
print("loaded", len(W), f"{time.time()-t:.0f}s", flush=True)
cache = {}


def parse(spec):
    method, _, rest = spec.partition(":")
    o = dict(G="32", act="0", wgrid="none", search="0", damp="0.01", block="128", refit="0")
    for kv in filter(None, re.split(r";", rest)):
        k, _, v = kv.partition("="); o[k] = v
    return method, o


for spec in sys.argv[2:]:
    method, o = parse(spec)
    t = time.time(); Q = {}; nb = 0.0; nw = 0; errs = {}
    for nm, w in W.items():
        if "embed" in nm or nm == "lm_head.weight": continue
        if o.get("int8") and re.search(o["int8"], nm):
            fmt = "int8"
        elif o.get("g64") and re.search(o["g64"], nm):
            fmt = "int4g64"
        elif o.get("g32") and re.search(o["g32"], nm):
            fmt = "int4g32"
        else:
            fmt = "int4g" + o["G"]
        nb += bits_of(fmt) * w.size; nw += w.size
        G = int(fmt[5:]) if fmt != "int8" else 32
        key = (nm, fmt, method, o["act"], o["wgrid"], o["search"], o["damp"], o["block"], o["refit"])
        if key not in cache:
            if fmt == "int8":
                q = int8(w)
            elif method == "rtn":
                d = {"none": None, "h": (lambda: np.diag(H[nm])), "absw": (lambda: np.abs(w) + 1e-8)}[o["wgrid"]]
                d = d() if d else None
                q = rtn(w, G, None if d is None else d, int(o["search"]))[0]
            elif method == "gptq":
                Hn = H[nm]
                q, c, S, M = gptq(w, Hn, G, block=int(o["block"]), damp=float(o["damp"]), actorder=o["act"] == "1",
                                  wgrid=None if o["wgrid"] == "none" else o["wgrid"], search=int(o["search"]))
                if o["refit"] == "1":
                    Hd = Hn + float(o["damp"]) * np.mean(np.diag(Hn)) * np.eye(Hn.shape[0])
                    q = refit_h(w, Hd, c, S, M, G)[0]
            cache[key] = q
        Q[nm] = cache[key]
        if H is not None: errs[nm] = rel_err(w, Q[nm], H[nm])
    qt = time.time() - t
    label = o.get("name", spec)
    if errs:
        json.dump(errs, open(f"/tmp/exp/errs_{re.sub('[^A-Za-z0-9_.=-]', '_', label)[:80]}.json", "w"), indent=0)
        bykind = {}
        for nm, e in errs.items(): bykind.setdefault(kind(nm), []).append(e)
        extra = "relerr " + " ".join(f"{k[:-5]}={np.mean(v):.4f}" for k, v in sorted(bykind.items()))
    else:
        extra = ""
    evaluate(label + f" [{'+'.join(hp.split('/')[-1].replace('.npy','') for hp in hpaths)}]", Q, nb / nw, qt, extra)
