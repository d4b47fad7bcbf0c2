import sys
import numpy as np
sys.path.insert(0, ".")
from tests.test_vulkan_attention import run
cases = [("float16", 8, 4, 256, 0, 8), ("int8", 4, 1, 64, 24, 3), ("float32", 2, 1, 128, 0, 11), ("bfloat16", 2, 2, 32, 40, 1),
         ("float32", 8, 4, 256, 0, 8), ("float32", 2, 1, 128, 0, 1)]
for kv, nh, nkv, hd, window, chunks in cases:
    ref = run(False, kv, nh, nkv, hd, window, chunks, seed=hd + chunks)
    got = run(True, kv, nh, nkv, hd, window, chunks, seed=hd + chunks)
    out = []
    for name in ("attn", "k", "v"):
        a, b = got[name], ref[name]
        if kv == "float32" or name == "attn":
            fa, fb = a.view(np.float32), b.view(np.float32)
            bad = np.nonzero(fa != fb)[0]
            ulp = np.abs(fa.view(np.int32).astype(np.int64) - fb.view(np.int32).astype(np.int64))
            out.append(f"{name}: {len(bad)} differ, max ulp {ulp.max()}, max rel {np.abs(fa-fb).max()/max(np.abs(fb).max(),1e-30):.2e}, first {bad[:6].tolist()}")
        else:
            out.append(f"{name}: {int((a != b).sum())} bytes differ")
    print(kv, nh, nkv, hd, chunks, "|", "; ".join(out), flush=True)
