"""`gemma-batch bench` and the transformers peer on the same cases, one after the other in one
session, and the ratio of their end-to-end generated tokens/s (and of prefill tokens/s).

Each side runs in its own process, so the first frees the GPU before the second loads. Both
write JSON into --out (gemma-batch.json, transformers.json) and this script adds
side_by_side.json with the ratios.

    python benchmarks/side_by_side.py --shape 1b --batch 1,8,32 --prompt-len 128 --gen-len 128 --backend vulkan
    python benchmarks/side_by_side.py --model gemma-3-270m --weights fp16 --batch 1,64 --backend vulkan

With --model (a folder, a .gguf file, gemma-3-270m or a Hugging Face name) both sides load that
model: gemma-batch in --weights (auto: as stored, a GGUF in its own quantization), transformers
in bf16 (a GGUF dequantized by transformers itself).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from gemma_batch.bench.metrics import prefill_flops  # noqa: E402
from gemma_batch.bench.report import align  # noqa: E402
from gemma_batch.bench.shapes import SHAPES, shape_config  # noqa: E402
from gemma_batch.model.config import Gemma3Config  # noqa: E402
from gemma_batch.model.sources import model_folder, model_gguf  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="1b", choices=list(SHAPES))
    parser.add_argument("--model", help="a real model instead of random weights of --shape (as run --model takes it)")
    parser.add_argument("--weights", default="auto", help="gemma-batch's weight format (bench --weights)")
    parser.add_argument("--batch", default="1,8,32", help="comma-separated batch sizes")
    parser.add_argument("--prompt-len", default="128")
    parser.add_argument("--gen-len", default="128")
    parser.add_argument("--backend", default="auto", help="gemma-batch's backend: auto, cpu or vulkan")
    parser.add_argument("--device", help="gemma-batch's Vulkan device")
    parser.add_argument("--out", type=Path, help="folder for the JSON reports (default: a new temporary one)")
    return parser.parse_args(argv)


def run(command: list[str]) -> None:
    """Run one side with the checkout importable; its output goes straight to the terminal."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    print("$ " + " ".join(command), file=sys.stderr, flush=True)
    subprocess.run(command, env=env, check=True)


def ratio(ours: float | None, theirs: float | None) -> float | None:
    return ours / theirs if ours and theirs else None


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="side_by_side_"))
    out.mkdir(parents=True, exist_ok=True)
    folder = model_folder(args.model, sys.stderr) if args.model else None
    peer_model = (model_gguf(args.model, sys.stderr) or folder) if folder else None  # (transformers reads a GGUF itself)
    which = ["--model", str(peer_model)] if folder else ["--shape", args.shape]
    cases = [*which, "--batch", args.batch, "--prompt-len", args.prompt_len, "--gen-len", args.gen_len]
    device = ["--device", args.device] if args.device else []
    run([sys.executable, "-m", "gemma_batch", "bench", *cases, "--weights", args.weights, "--backend", args.backend,
         *device, "--json", str(out / "gemma-batch.json")])
    run([sys.executable, str(REPO / "benchmarks" / "hf_peer.py"), *cases, "--json", str(out / "transformers.json")])

    ours, peer = (json.loads((out / name).read_text()) for name in ("gemma-batch.json", "transformers.json"))
    rows = []
    cfg = Gemma3Config.from_dir(folder) if folder else shape_config(args.shape)
    flops_per_token = prefill_flops(cfg, int(args.prompt_len)) / int(args.prompt_len)  # the peer's
    for a, b in zip(ours["cases"], peer["cases"]):
        rows.append({
            "batch": a["batch"],
            "gemma_batch_e2e_tokens_per_s": a["e2e_tokens_per_s"],
            "transformers_e2e_tokens_per_s": b["e2e_tokens_per_s"],
            "e2e_ratio": ratio(a["e2e_tokens_per_s"], b["e2e_tokens_per_s"]),
            "gemma_batch_prefill_tokens_per_s": a["prefill_tokens_per_s"],
            "transformers_prefill_tokens_per_s": b["prefill_tokens_per_s"],
            "prefill_ratio": ratio(a["prefill_tokens_per_s"], b["prefill_tokens_per_s"]),
            "gemma_batch_prefill_tflops": a["prefill_tflops"],
            "transformers_prefill_tflops": b["prefill_tokens_per_s"] * flops_per_token / 1e12,
        })
    (out / "side_by_side.json").write_text(json.dumps({"gemma_batch": ours["run"], "transformers": peer["run"],
                                                       "cases": rows}, indent=2) + "\n")
    what = f"model {args.model} ({ours['run']['weights']} here, bf16 in transformers)" if folder else \
        f"shape {args.shape}, {ours['run']['weights']} random weights"
    print(f"\n{what}, {args.prompt_len} prompt + {args.gen_len} generated tokens "
          f"per sequence, greedy\ngemma-batch: {ours['run']['backend']}\ntransformers: {peer['run']['peer']} "
          f"on {peer['run']['device']}\n")
    table = [["batch", "gemma-batch e2e tok/s", "transformers e2e tok/s", "ratio",
              "gemma-batch prefill tok/s", "transformers prefill tok/s", "ratio",
              "gemma-batch prefill TFLOP/s", "transformers prefill TFLOP/s"]]
    for r in rows:
        table.append([str(r["batch"])] + [
            "n/a" if r[k] is None else f"{r[k]:,.2f}" if k.endswith("ratio") else f"{r[k]:,.1f}"
            for k in list(r)[1:]])
    print("\n".join(align(table)))
    print(f"\nreports: {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
