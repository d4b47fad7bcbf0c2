"""The job users run, timed: `gemma-batch run` over a JSONL of prompts on a random-weight checkpoint
of a real shape, reading, tokenizing and writing included, once per step budget asked.

    python benchmarks/job_bench.py --shape 4b --rows 32 --prompt-len 1024 --max-tokens 8 \
        --max-step-tokens default,512,4096 --out DIR [--backend vulkan] [--flags "" --flags "--choices a,b"]
    python benchmarks/job_bench.py --rows 2000 --prompt-len 1100 --shared-prefix 1000 --max-batch 32 \
        --flags "" --flags=--no-prefix-cache --out DIR      # the labelling job with a shared instruction

DIR gets the checkpoint (`model-SHAPE/`, written once: `gemma_batch.bench.random_checkpoint`; or
`--model M`, a real model as `run --model` takes it), the prompts (`prompts-ROWSxLEN[-sharedN].jsonl`:
random text of the demo tokenizer's pieces (the real model's own, with --model), LEN tokens
each with the BOS, the first N of them the same in every row with --shared-prefix N), and per budget the job's output, its stats and its log. Each job is a fresh
`gemma-batch run --force` process with default flags but those named here. Prints, per budget, the
job's wall time (the stats' `wall_seconds`: from the first row read to the file written), its
start-up (the stats' `startup_seconds`: from the process's start to the first step), prompt
and generated tokens over that time (`prefill_tokens` over it, and the stats'
`generated_tokens_per_s`), and generated tokens over the process's whole time (model loading included), and writes them with
the whole stats row to DIR/job_bench.json. `--flags` (repeatable) runs each budget once per set of
extra `run` flags given (shell words), to compare jobs side by side in one call.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
from gemma_batch.bench.random_checkpoint import DEMO_TOKENIZER, write_random_checkpoint  # noqa: E402
from gemma_batch.bench.report import align  # noqa: E402
from gemma_batch.bench.shapes import shape_config  # noqa: E402
from gemma_batch.job.final_file import stats_path  # noqa: E402
from gemma_batch.model.config import Gemma3Config  # noqa: E402
from gemma_batch.model.sources import model_folder  # noqa: E402
from gemma_batch.model.tokenizer import Tokenizer  # noqa: E402

def one_token_words(tokenizer: Tokenizer, vocab_size: int) -> list[str]:
    """Words that are one piece of the tokenizer each after a space, with ids under the model's
    `vocab_size`: a text of n of them, each after a space, is n pieces."""
    words = []
    for i in range(min(tokenizer.vocab_size, vocab_size)):
        word = tokenizer.decode([i]).strip()
        if word.isalpha() and tokenizer.encode(" " + word, add_bos=False) == [i]:
            words.append(word)
    return words


def prompt_of(tokenizer: Tokenizer, words: list[str], rng: np.random.Generator, length: int, start: str = "") -> str:
    """Random text that tokenizes into exactly `length` ids, BOS included, after `start` (a text
    of such words, as this function writes it)."""
    text = start + "".join(" " + words[i] for i in rng.integers(0, len(words), length - 1))
    if len(tokenizer.encode(text)) != length + len(tokenizer.encode(start, add_bos=False)):
        raise RuntimeError(f"{length - 1} one-piece words did not tokenize into {length - 1} pieces")
    return text


def write_prompts(path: Path, tokenizer: Tokenizer, vocab_size: int, rows: int, length: int, seed: int,
                  shared: int = 0) -> None:
    """`rows` prompts of `length` tokens of `tokenizer`; the first `shared` of them (BOS included)
    the same in every row."""
    rng = np.random.default_rng(seed)
    words = one_token_words(tokenizer, vocab_size)
    start = prompt_of(tokenizer, words, rng, shared) if shared else ""
    lines = [json.dumps({"id": f"row-{i}", "prompt": prompt_of(tokenizer, words, rng, length - shared + bool(shared), start)})
             for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")


def run_job(args: argparse.Namespace, model: Path, prompts: Path, budget: str, extra: str, n: int) -> dict:
    """One job; `budget` a number of tokens, or "default" (no --max-step-tokens: the backend's);
    `extra` more flags (shell words); `n` numbers its files."""
    output = args.out / f"out-{budget}-{n}.parquet"
    flag = [] if budget == "default" else ["--max-step-tokens", budget]
    command = [sys.executable, "-m", "gemma_batch", "run", str(prompts), "--model", str(model), "--output", str(output),
               "--max-tokens", str(args.max_tokens), "--max-batch", str(args.max_batch or args.rows), *flag,
               "--backend", args.backend, "--force", *shlex.split(extra)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    (args.out / f"out-{budget}-{n}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    stats = pq.read_table(stats_path(output)).to_pylist()[0]
    return {"max_step_tokens": budget, "flags": extra, "command": shlex.join(command), "process_s": seconds, **stats,
            "generated_tokens_per_s_process": stats["generated_tokens"] / seconds}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="4b")
    parser.add_argument("--model", help="a real model instead of --shape's random weights: anything `run --model` "
                                        "takes (a GGUF file, a folder, gemma-3-270m, a Hugging Face name)")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--shared-prefix", type=int, default=0, help="prompt tokens every row shares (BOS included)")
    parser.add_argument("--max-batch", type=int, default=None, help="the job's --max-batch (default: --rows)")
    parser.add_argument("--max-step-tokens", default="default",
                        help="comma-separated step budgets, one job each; `default`: the flag left out")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--flags", action="append", default=None, help="extra run flags of one job (repeatable)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.model:  # the model's own tokenizer: prompts of its real vocabulary
        folder = model_folder(args.model, sys.stderr)
        model, tokenizer = args.model, Tokenizer.from_dir(folder)
        vocab, what = Gemma3Config.from_dir(folder).vocab_size, f"model {args.model}"
    else:
        model, tokenizer = write_random_checkpoint(args.shape, args.out / f"model-{args.shape}", args.seed), Tokenizer.from_file(DEMO_TOKENIZER)
        vocab, what = shape_config(args.shape).vocab_size, f"shape {args.shape}, random bf16 weights"
    shared = f"-shared{args.shared_prefix}" if args.shared_prefix else ""
    prompts = args.out / f"prompts-{args.rows}x{args.prompt_len}{shared}.jsonl"
    write_prompts(prompts, tokenizer, vocab, args.rows, args.prompt_len, args.seed, args.shared_prefix)
    runs = [run_job(args, model, prompts, b, extra, n) for b in args.max_step_tokens.split(",")
            for n, extra in enumerate(args.flags or [""])]
    (args.out / "job_bench.json").write_text(json.dumps({"shape": args.shape, "model": args.model, "rows": args.rows,
                                                         "prompt_len": args.prompt_len, "shared_prefix": args.shared_prefix,
                                                         "runs": runs}, indent=1))
    table = [["max step tokens", "flags", "job s", "rows/s", "process s", "start-up s", "rows/s (process)",
              "prompt tok/s (job)", "generated tok/s (job)", "generated tok/s (process)", "prefix cache", "backend"]]
    for r in runs:
        startup = f"{r['startup_seconds']:.2f}" if "startup_seconds" in r else "-"
        table.append([str(r["max_step_tokens"]), r["flags"] or "-", f"{r['wall_seconds']:.2f}", f"{r['rows_per_s']:,.2f}",
                      f"{r['process_s']:.2f}", startup, f"{r['rows_total'] / r['process_s']:,.2f}",
                      f"{r['prefill_tokens'] / r['wall_seconds']:,.1f}", f"{r['generated_tokens_per_s']:,.1f}",
                      f"{r['generated_tokens_per_s_process']:,.1f}", f"{100 * r.get('prefix_hit_rate', 0):.0f}%",
                      str(r.get("backend"))])
    print(f"gemma-batch run: {what}, {args.rows} prompts of {args.prompt_len} tokens"
          f"{f' ({args.shared_prefix} shared)' if args.shared_prefix else ''}, {args.max_tokens} new each")
    print("\n".join(align(table)))


if __name__ == "__main__":
    main(sys.argv[1:])
