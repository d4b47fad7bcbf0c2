"""Build `sample_data/demo-model/`: a tiny Gemma 3 in the Hugging Face layout, random weights.

It exists so that `gemma-batch` runs out of the box with no download; it does not write real
text. The tokenizer is a SentencePiece BPE model with Gemma 3's special-token ids, trained on
the docstrings of Python's standard library; the weights are bfloat16 like the hub checkpoints.

    python sample_data/make_demo_model.py        # needs the test extra (torch, transformers)
"""

from __future__ import annotations

import contextlib
import importlib
import io
import shutil
from pathlib import Path

import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from gemma_batch.model.tokenizer_build import build_gemma_tokenizer

OUT = Path(__file__).resolve().parent / "demo-model"
VOCAB = 2048
CORPUS_MODULES = ("this", "json", "pathlib", "collections", "argparse", "dataclasses", "textwrap", "string")


def corpus() -> list[str]:
    """Paragraphs of English from standard-library docstrings (deterministic for one Python)."""
    texts = []
    for name in CORPUS_MODULES:
        with contextlib.redirect_stdout(io.StringIO()):  # `import this` prints the Zen of Python
            module = importlib.import_module(name)
        for obj in [module, *vars(module).values()]:
            doc = getattr(obj, "__doc__", None)
            if isinstance(doc, str) and len(doc) > 40:
                texts.extend(p.strip() for p in doc.split("\n\n") if p.strip())
    return sorted(set(texts))


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    build_gemma_tokenizer(corpus(), VOCAB, OUT)
    cfg = Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=6,  # layers 0-4 sliding-window, layer 5 global, as in the real pattern
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        query_pre_attn_scalar=32,
        sliding_window=64,
        max_position_embeddings=4096,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        eos_token_id=[1, 106],
        bos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # norms around zero as in trained checkpoints
            p.copy_(torch.randn(p.shape) * (0.1 if "norm" in name else 0.05))
    model.to(torch.bfloat16).save_pretrained(OUT)
    print(f"wrote {OUT}: {sum(p.numel() for p in model.parameters()):,} parameters")


if __name__ == "__main__":
    main()
