"""How far the Vulkan backend's numerics move from the CPU backend's, per choice of the fast paths.

    python benchmarks/fidelity.py [--passages 48] [--tokens 256] [--kv-dtype fp16] [--json out.json]

On the demo model (bf16 weights, `sample_data/`): the held-out passages (`sample_data/kjv-heldout.txt`)
are scored through the engine, every token's logits returned, on the CPU backend (the reference)
and on the Vulkan backend once per setting of its switches (each in its own process, as a user
sets them): split or fp16 inputs of the matrix units (GEMMA_BATCH_VK_COOPMAT_INPUTS) and prefill
attention on the matrix units or not (GEMMA_BATCH_VK_FLASH), and the default without the prompt
tile (GEMMA_BATCH_VK_PROMPT_TILE=0: prompt tokens' products in K chunks). Per setting: the largest logit
difference from the CPU backend, the perplexity change, the top-1 agreement, and whether greedy
completions of the sample prompts (`sample_data/prompts.jsonl`'s plain prompts, 32 new tokens) equal the CPU's.
Both backends use the same KV dtype, so only the kernels' arithmetic differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

from gemma_batch.backends import create_backend
from gemma_batch.engine.generate import generate_greedy
from gemma_batch.engine.score import heldout_sequences, scores_of, token_logits
from gemma_batch.model.checkpoint import DEMO_MODEL, Checkpoint
from gemma_batch.model.config import Gemma3Config
from gemma_batch.model.tokenizer import Tokenizer

SETTINGS = {  # name -> environment
    "split inputs, flash attention": {"GEMMA_BATCH_VK_COOPMAT_INPUTS": "split", "GEMMA_BATCH_VK_FLASH": "1"},
    "fp16 inputs, flash attention": {"GEMMA_BATCH_VK_COOPMAT_INPUTS": "fp16", "GEMMA_BATCH_VK_FLASH": "1"},
    "split inputs, attention.comp": {"GEMMA_BATCH_VK_COOPMAT_INPUTS": "split", "GEMMA_BATCH_VK_FLASH": "0"},
    "fp16 inputs, attention.comp": {"GEMMA_BATCH_VK_COOPMAT_INPUTS": "fp16", "GEMMA_BATCH_VK_FLASH": "0"},
    "fp16 inputs, flash attention, no prompt tile": {"GEMMA_BATCH_VK_COOPMAT_INPUTS": "fp16", "GEMMA_BATCH_VK_FLASH": "1",
                                                      "GEMMA_BATCH_VK_PROMPT_TILE": "0"},
}
NEW_TOKENS = 32


def outputs(backend_name: str, kv_dtype: str, passages: int, tokens: int) -> dict:
    """Every fed token's logits over the passages, and greedy completions of the sample prompts."""
    cfg = Gemma3Config.from_dir(DEMO_MODEL)
    backend = create_backend(backend_name, cfg, kv_dtype=kv_dtype)
    backend.load_weights(Checkpoint.open(DEMO_MODEL, cfg).tensors())
    tokenizer = Tokenizer.from_dir(DEMO_MODEL)
    sequences = heldout_sequences(DEMO_MODEL.parent / "kjv-heldout.txt", tokenizer, tokens, passages)
    logits = token_logits(backend, sequences, step_token_budget=512)
    rows_in = [json.loads(line) for line in (DEMO_MODEL.parent / "prompts.jsonl").read_text().splitlines()]
    ids = [tokenizer.encode(r["prompt"], add_bos=True) for r in rows_in if "prompt" in r]  # (the plain prompts)
    completions = generate_greedy(backend, ids, NEW_TOKENS, stop_token_ids=frozenset(cfg.eos_token_ids))
    return {"sequences": sequences, "logits": logits, "completions": completions, "identity": backend.identity}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--kv-dtype", default="fp16")
    parser.add_argument("--json")
    parser.add_argument("--dump", help=argparse.SUPPRESS)  # (a child process: write this backend's outputs here)
    parser.add_argument("--backend", default="vulkan", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dump:
        np.save(args.dump, np.array(outputs(args.backend, args.kv_dtype, args.passages, args.tokens), dtype=object),
                allow_pickle=True)
        return
    ref = outputs("cpu", args.kv_dtype, args.passages, args.tokens)
    ref_scores = scores_of(ref["sequences"], ref["logits"])
    ref_ppl = ref_scores.perplexity
    print(f"demo model, {len(ref['sequences'])} passages of up to {args.tokens} tokens, KV {args.kv_dtype}; "
          f"CPU backend perplexity {ref_ppl:.4f}")
    report = {"kv_dtype": args.kv_dtype, "cpu_perplexity": ref_ppl, "settings": {}}
    for name, env in SETTINGS.items():
        dump = f"/tmp/fidelity-{os.getpid()}.npy"
        base = [sys.executable, __file__, "--dump", dump, "--passages", str(args.passages), "--tokens", str(args.tokens),
                "--kv-dtype", args.kv_dtype]
        subprocess.run(base, env={**os.environ, **env}, check=True)
        got = np.load(dump, allow_pickle=True).item()
        os.unlink(dump)
        scores = scores_of(got["sequences"], got["logits"])
        ppl = scores.perplexity
        row = {"identity": got["identity"],
               "max_logit_diff": float(max(np.abs(a - b).max() for a, b in zip(got["logits"], ref["logits"]))),
               "perplexity_change": ppl / ref_ppl - 1, "top1_agreement": scores.top1_agreement(ref_scores),
               "greedy_equal": got["completions"] == ref["completions"]}
        report["settings"][name] = row
        print(f"{name:32s} max logit diff {row['max_logit_diff']:.2e}  perplexity {100 * row['perplexity_change']:+.4f}%  "
              f"top-1 {100 * row['top1_agreement']:.2f}%  greedy equal: {row['greedy_equal']}  ({got['identity']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
