"""Chained dispatches against barriers: every step's logits bit for bit, batched run with prefill
in chunks of `budget` tokens, on the demo model and a 2-layer 4b-like random model.
usage: check.py [budget] [new_tokens]"""
import os, sys
from pathlib import Path
import numpy as np
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.engine.generate import generate_greedy

# the models of the attention experiments' bit-for-bit checks
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "2026-11-24-h100-attention" / "experiments"))
from common import models  # noqa: E402

budget = int(sys.argv[1]) if len(sys.argv) > 1 else 7
new = int(sys.argv[2]) if len(sys.argv) > 2 else 24

def run(cfg, tensors, chain, chunk):
    os.environ["GEMMA_BATCH_VK_CHAIN"] = "1" if chain else "0"
    backend = VulkanBackend(cfg, attention_chunk=chunk)
    backend.load_weights(tensors())
    out = []
    def on_step(idx, batch, result):
        out.append(np.asarray(result.logits).view(np.uint32).copy())
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(3, cfg.vocab_size, n)) for n in (3, 40, 9, 77, 20)]
    comp = generate_greedy(backend, prompts, new, step_token_budget=budget, on_step=on_step)
    timeouts = backend.mem.download(backend.buffers.chain).view(np.uint32).reshape(-1, 16)[:, 1].sum()
    backend.close()
    return comp, out, int(timeouts)

ok = True
for mname, cfg, tensors in models():
    for chunk in (4, 64):
        ref = run(cfg, tensors, False, chunk)
        got = run(cfg, tensors, True, chunk)
        bad = [i for i, (a, b) in enumerate(zip(got[1], ref[1])) if not np.array_equal(a, b)]
        same = got[0] == ref[0] and len(got[1]) == len(ref[1]) and not bad
        print(f"{mname} chunk {chunk}: {len(ref[1])} steps, timeouts {got[2]}: {'IDENTICAL' if same else 'DIFFERENT at ' + str(bad[:5])}", flush=True)
        ok &= same and got[2] == 0
print("ALL IDENTICAL" if ok else "SOME DIFFER")
