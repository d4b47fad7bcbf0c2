# Experiment (attention_warp.glsl): two saved runs of warp_greedy.py / warp_tiny.py compared (largest relative logit difference, prompt and decode rows; equal completions).
import sys, numpy as np
a = np.load(sys.argv[1], allow_pickle=True).item(); b = np.load(sys.argv[2], allow_pickle=True).item()
r0, r1, lens = a["rows"], b["rows"], a["lens"]
wp = wd = 0.0; ident = 0
for key in r0.keys() & r1.keys():
    s, pos = key
    d = float(np.abs(r0[key] - r1[key]).max() / np.abs(r0[key]).max())
    ident += d == 0
    if pos < lens[s]: wp = max(wp, d)
    else: wd = max(wd, d)
print("rows", len(r0), len(r1), "identical", ident, "prompt max rel", wp, "decode max rel", wd)
print("greedy equal", sum(x == y for x, y in zip(a["out"], b["out"])), "of", len(a["out"]))
