"""Scratch: fp16 inputs vs split on the coop path, against the CPU backend."""
import os, sys, json
import numpy as np
sys.path.insert(0, ".")
from gemma_batch.backends import create_backend
from gemma_batch.backends.cpu import CpuBackend
from gemma_batch.engine.score import heldout_sequences, score
from gemma_batch.job.spec import DEMO_MODEL
from gemma_batch.model.checkpoint import Checkpoint
from gemma_batch.model.config import Gemma3Config
from gemma_batch.model.tokenizer import Tokenizer
from tests.test_cpu_vs_transformers import run_batched, cpu_backend
CFG = Gemma3Config.from_dir(DEMO_MODEL)
seqs = heldout_sequences(DEMO_MODEL.parent / "kjv-heldout.txt", Tokenizer.from_dir(DEMO_MODEL), max_tokens=256)
cpu = CpuBackend(CFG); cpu.load_weights(Checkpoint.open(DEMO_MODEL, CFG).tensors())
ref = score(cpu, seqs)
out = {"cpu_ppl": ref.perplexity}
from gemma_batch.backends.vulkan import VulkanBackend
for mode in ("split", "fp16"):
    os.environ["GEMMA_BATCH_VK_COOPMAT_INPUTS"] = mode
    b = create_backend("vulkan", CFG)
    b.load_weights(Checkpoint.open(DEMO_MODEL, CFG).tensors())
    if os.environ.get("SHORT"): seqs = [x[:64] for x in seqs[:2]]; ref = score(cpu, seqs)
    s = score(b, seqs)
    lp = np.concatenate(s.logprobs) - np.concatenate(ref.logprobs)
    out[mode] = {"identity": b.identity, "ppl": s.perplexity, "ppl_rel": s.perplexity / ref.perplexity - 1,
                 "top1": s.top1_agreement(ref), "logprob_maxabs": float(np.abs(lp).max())}
    b.close()
    vb = VulkanBackend(CFG, kv_dtype="fp32"); vb.load_weights(Checkpoint.open(DEMO_MODEL, CFG).tensors())
    comp, logits = run_batched(vb, step_token_budget=7)
    rc, rl = run_batched(cpu_backend(DEMO_MODEL), step_token_budget=7)
    out[mode]["demo_logits_maxabs"] = max(float(np.abs(a - r).max()) for a, r in zip(logits, rl))
    out[mode]["demo_logits_scale"] = max(float(np.abs(r).max()) for r in rl)
    out[mode]["demo_greedy_same"] = comp == rc
    vb.close()
    print(mode, out[mode], flush=True)
json.dump(out, open(os.environ.get("OUT", ".") + "/prec.json", "w"), indent=1)
