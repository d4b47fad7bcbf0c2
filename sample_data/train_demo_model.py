"""Train the bundled demo model: a small Gemma 3 that writes King James English.

    python sample_data/train_demo_model.py                  # fetches the corpus with apt-get
    python sample_data/train_demo_model.py --corpus kjv.txt --device cuda

Needs the test extra (torch, transformers). The corpus is the King James Bible (public domain)
from Debian's `bible-kjv-text` package, read out with the package's own `bible` program
(`apt-get download bible-kjv bible-kjv-text`: no root needed). `--corpus` takes that program's
output (`bible -f "gen1:1-rev22:21"`: one verse per line, `Ge1:1 In the beginning ...`) where
apt-get is not available, for example on a GPU machine without a network.

Every 25th chapter is held out: it trains neither the tokenizer nor the model, and is written
to `sample_data/kjv-heldout.txt` (one chapter per line) for the quality tests. The model is
`Gemma3ForCausalLM` itself (5 sliding-window layers and 1 global, GQA, tied embeddings), trained
on 256-token windows of the chapters (each `<bos> text <eos>`), and saved in bfloat16 like the
hub checkpoints; `training_report.json` records the held-out perplexity of the saved weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch
import torch.nn.functional as F
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from gemma_batch.model.tokenizer_build import build_gemma_tokenizer

HERE = Path(__file__).resolve().parent
OUT = HERE / "demo-model"
HELDOUT = HERE / "kjv-heldout.txt"
HELDOUT_EVERY = 25  # chapter i is held out when i % 25 == 12
VOCAB = 4096
SEQ = 256  # training window; longer than the sliding window, so both layer kinds matter
BOS, EOS = 2, 1


def model_config() -> Gemma3TextConfig:
    """About 5.5 M parameters: hidden 256, 6 layers (layers 0-4 sliding, 5 global), 4 query heads
    sharing 1 KV head of 64."""
    return Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=64,
        query_pre_attn_scalar=64,
        sliding_window=128,
        max_position_embeddings=4096,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        eos_token_id=[EOS, 106],
        bos_token_id=BOS,
        pad_token_id=0,
    )


def fetch_kjv(workdir: Path) -> str:
    """The `bible -f` text of the whole KJV, from Debian's packages."""
    subprocess.run(["apt-get", "download", "bible-kjv", "bible-kjv-text"], cwd=workdir, check=True)
    root = workdir / "root"
    for deb in sorted(workdir.glob("*.deb")):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    bible = [str(root / "usr/bin/bible"), "-f", "-p", str(root / "usr/lib"), "gen1:1-rev22:21"]
    return subprocess.run(bible, check=True, capture_output=True, text=True).stdout


def chapters(text: str) -> list[tuple[str, str]]:
    """(reference, text) per chapter, in order: the verses of `Ge1:1 ...` lines joined by spaces."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        ref, verse = line.split(" ", 1)
        chapter = ref.rsplit(":", 1)[0]
        if not out or out[-1][0] != chapter:
            out.append((chapter, []))
        out[-1][1].append(verse.strip())
    if len(out) != 1189:
        raise ValueError(f"expected the 1,189 chapters of the KJV, found {len(out)}")
    return [(ref, " ".join(verses)) for ref, verses in out]


def token_stream(sp: spm.SentencePieceProcessor, docs: list[str]) -> np.ndarray:
    """Every document as `<bos> ids <eos>`, concatenated."""
    ids = [[BOS, *sp.encode(d), EOS] for d in docs]
    return np.concatenate([np.asarray(i, np.int64) for i in ids])


@torch.no_grad()
def heldout_nll(model: Gemma3ForCausalLM, sp: spm.SentencePieceProcessor, docs: list[str], device: str) -> float:
    """Mean next-token negative log-likelihood over the held-out chapters, each read in
    consecutive windows of SEQ tokens from its `<bos>` (the first token of a window is not scored)."""
    model.eval()
    total, count = 0.0, 0
    for d in docs:
        ids = torch.tensor([BOS, *sp.encode(d), EOS], device=device)
        for start in range(0, len(ids) - 1, SEQ):
            x = ids[start : start + SEQ + 1][None]
            logits = model(input_ids=x[:, :-1]).logits.float()
            total += F.cross_entropy(logits[0], x[0, 1:], reduction="sum").item()
            count += x.shape[1] - 1
    model.train()
    return total / count


def train(args: argparse.Namespace, sp: spm.SentencePieceProcessor, train_docs: list[str], held_docs: list[str]) -> dict:
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    stream = token_stream(sp, train_docs)
    model = Gemma3ForCausalLM(model_config()).to(args.device).train()
    decay = [p for n, p in model.named_parameters() if p.ndim == 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    steps_per_epoch = len(stream) // (SEQ * args.batch)
    total = steps_per_epoch * args.epochs
    warmup = min(200, total // 10)
    best = (float("inf"), None, 0)
    start = time.time()
    for step in range(total):
        lr = args.lr * (step + 1) / warmup if step < warmup else \
            args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup))))
        for group in opt.param_groups:
            group["lr"] = lr
        offsets = rng.integers(0, len(stream) - SEQ - 1, args.batch)
        x = torch.from_numpy(np.stack([stream[o : o + SEQ + 1] for o in offsets])).to(args.device)
        with torch.autocast(args.device.split(":")[0], torch.bfloat16, enabled=args.device != "cpu"):
            logits = model(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % steps_per_epoch == 0 or step + 1 == total:
            nll = heldout_nll(model, sp, held_docs, args.device)
            print(f"step {step + 1}/{total}  train loss {loss.item():.3f}  held-out ppl {math.exp(nll):.2f}  "
                  f"{time.time() - start:.0f} s", flush=True)
            if nll < best[0]:
                best = (nll, {k: v.detach().clone() for k, v in model.state_dict().items()}, step + 1)
    model.load_state_dict(best[1])
    return {"model": model, "best_step": best[2], "steps": total, "train_seconds": round(time.time() - start, 1),
            "train_tokens": int(len(stream))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, help="`bible -f` output; fetched with apt-get when omitted")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    if args.corpus:
        text = args.corpus.read_text(encoding="utf-8")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            text = fetch_kjv(Path(tmp))
    chaps = chapters(text)
    held = [c for i, c in enumerate(chaps) if i % HELDOUT_EVERY == HELDOUT_EVERY // 2]
    kept = [c for i, c in enumerate(chaps) if i % HELDOUT_EVERY != HELDOUT_EVERY // 2]
    HELDOUT.write_text("".join(f"{ref}\t{body}\n" for ref, body in held), encoding="utf-8")

    shutil.rmtree(args.out, ignore_errors=True)
    build_gemma_tokenizer([body for _, body in kept], VOCAB, args.out)
    sp = spm.SentencePieceProcessor(model_file=str(args.out / "tokenizer.model"))
    result = train(args, sp, [b for _, b in kept], [b for _, b in held])

    model = result.pop("model").to(torch.bfloat16)
    model.save_pretrained(args.out)
    shipped_nll = heldout_nll(model.float(), sp, [b for _, b in held], args.device)  # the bf16 weights
    report = {
        "corpus": "King James Bible, Debian bible-kjv-text 4.38",
        "corpus_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "heldout_chapters": len(held), "heldout_ppl": round(math.exp(shipped_nll), 3),
        "parameters": sum(p.numel() for p in model.parameters()),
        **{k: v for k, v in vars(args).items() if k not in ("corpus", "out")}, **result,
    }
    (args.out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
