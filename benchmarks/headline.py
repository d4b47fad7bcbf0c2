"""The figures docs/PERFORMANCE.md leads with, in one command on a GPU machine: gemma-batch against
transformers (and llama.cpp's Vulkan server, when its peer script is given) on a decode-shaped job
(128-token prompts, 128 new tokens, batch 1 and 32) and a labelling-shaped one (32 x 1,024-token
prompts, 8 new tokens), random bf16 weights, greedy, all in one call.

    python benchmarks/headline.py --shape 4b --out results [--llamacpp DIR]

Each job runs through `side_by_side.py` (its JSON lands in OUT/decode and OUT/labelling). With
--llamacpp, DIR holds the llama.cpp peer (`llamacpp_peer.sh`, the `hf_baseline.py` it imports and a
`peer_tokenizer.model`, from the project's shared device folder), and `.lcp/` and `.gl/` are in the
checkout (see shared/device/README.md); its JSON lines go to OUT/llamacpp.jsonl. The table is
printed and written to OUT/headline.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JOBS = {  # name: (batches, prompt tokens, new tokens)
    "decode": ("1,32", 128, 128),
    "labelling": ("32", 1024, 8),
}
LLAMACPP_CASES = "1:128:128 32:128:128 32:1024:8"  # concurrency:prompt:new, the same jobs


def side_by_side(shape: str, job: str, backend: str, out: Path) -> list[dict]:
    batches, prompt, new = JOBS[job]
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "side_by_side.py"), "--shape", shape,
                    "--batch", batches, "--prompt-len", str(prompt), "--gen-len", str(new),
                    "--backend", backend, "--out", str(out / job)], check=True)
    report = json.loads((out / job / "side_by_side.json").read_text())
    ours = json.loads((out / job / "gemma-batch.json").read_text())["cases"]
    return [dict(row, job=job, prompt_len=prompt, gen_len=new, gemma_batch_decode_tokens_per_s=case["decode_tokens_per_s"],
                 bandwidth_fraction=case["bandwidth_fraction"])
            for row, case in zip(report["cases"], ours)]


def llamacpp(shape: str, peer: Path, out: Path) -> dict[tuple[int, int, int], dict]:
    env = {**os.environ, "TOKENIZER": str(peer / "peer_tokenizer.model")}
    done = subprocess.run(["bash", str(peer / "llamacpp_peer.sh"), shape, LLAMACPP_CASES], env=env, cwd=REPO,
                          check=True, capture_output=True, text=True)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    (out / "llamacpp.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return {(line["concurrency"], line["prompt"], line["new"]): line for line in lines}


def table(rows: list[dict], peer: dict[tuple[int, int, int], dict]) -> str:
    def num(value: float | None, digits: int = 1) -> str:
        return "" if value is None else f"{value:,.{digits}f}"

    lines = ["| job | gemma-batch | transformers | ratio | llama.cpp |", "|---|---|---|---|---|"]
    for r in rows:
        shape = f"{r['batch']} x {r['prompt_len']:,} + {r['gen_len']}"
        lcp = peer.get((r["batch"], r["prompt_len"], r["gen_len"]), {})
        lines.append(f"| {shape}: end to end, generated tok/s | {num(r['gemma_batch_e2e_tokens_per_s'])} | "
                     f"{num(r['transformers_e2e_tokens_per_s'])} | {num(r['e2e_ratio'], 2)}x | "
                     f"{num(lcp.get('end_to_end_gen_tok_s'))} |")
        lines.append(f"| {shape}: prefill tok/s (TFLOP/s) | {num(r['gemma_batch_prefill_tokens_per_s'], 0)} "
                     f"({num(r['gemma_batch_prefill_tflops'])}) | {num(r['transformers_prefill_tokens_per_s'], 0)} "
                     f"({num(r['transformers_prefill_tflops'])}) | {num(r['prefill_ratio'], 2)}x | "
                     f"{num(lcp.get('prompt_tok_s'), 0)} |")
        if r["job"] == "decode":
            lines.append(f"| {shape}: decode tok/s (roofline fraction) | {num(r['gemma_batch_decode_tokens_per_s'])} "
                         f"({100 * r['bandwidth_fraction']:.1f}%) | | | {num(lcp.get('decode_tok_s'))} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="4b")
    parser.add_argument("--backend", default="vulkan", help="gemma-batch's backend (cpu, with --shape tiny, for a smoke test)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--llamacpp", type=Path, help="folder holding llamacpp_peer.sh and peer_tokenizer.model")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [row for job in JOBS for row in side_by_side(args.shape, job, args.backend, args.out)]
    peer = llamacpp(args.shape, args.llamacpp, args.out) if args.llamacpp else {}
    (args.out / "headline.json").write_text(json.dumps({"rows": rows, "llamacpp": list(peer.values())}, indent=1))
    text = table(rows, peer)
    (args.out / "headline.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
