"""Chained dispatches against barriers: every step's logits bit for bit, batched run with prefill
in chunks of `budget` tokens, on the demo model and a 2-layer 4b-like random model.
usage: check.py [budget] [new_tokens]"""
import dataclasses, os, sys
from pathlib import Path
import numpy as np
from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.bench.random_weights import random_tensors
from gemma_batch.bench.shapes import shape_config
from gemma_batch.engine.generate import generate_greedy
from gemma_batch.model.checkpoint import Checkpoint
from gemma_batch.model.config import Gemma3Config

budget = int(sys.argv[1]) if len(sys.argv) > 1 else 7
new = int(sys.argv[2]) if len(sys.argv) > 2 else 24

def models():
    d = Path("sample_data/demo-model")
    cfg = Gemma3Config.from_dir(d)
    yield "demo", cfg, lambda: Checkpoint.open(d, cfg).tensors()
    c4 = dataclasses.replace(shape_config("4b"), num_layers=2, vocab_size=512)
    yield "4b-2layer", c4, lambda: random_tensors(c4, 0)

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
