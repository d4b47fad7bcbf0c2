"""A labelling job on a real model, three ways in one call: `gemma-batch run`, Hugging Face
transformers loading the same GGUF file itself, and llama.cpp's server on the same GGUF.

    python benchmarks/real_labelling.py --model gemma-3-270m-q4_k_m.gguf --rows 2000 --out DIR \
        [--flags "--max-batch 128" --flags "--max-batch 128 --weights fp16"] [--peers transformers,llamacpp] [--lcp .lcp]

The input (DIR/prompts.jsonl): `--rows` distinct windows of `--words` words of the held-out
passages (`sample_data/kjv-heldout.txt`; the window of passage p on pass k starts at word 7k
modulo the passage's length less the window, a window already taken skipped), each followed by a
newline and "Topic in one word:"; `--max-tokens` new tokens a row (default 4), greedy.

- gemma-batch: one `gemma-batch run --force` process per `--flags` set (shell words), default
  flags otherwise; the process's wall time, the stats' job time (`wall_seconds`), and the rows.
- transformers (`--peers transformers`, on CUDA, bf16, sdpa): `from_pretrained(folder,
  gguf_file=...)`, the prompts sorted by length in batches of `--hf-batch` (left-padded), greedy
  `generate`; the process's time, its load time, and the generation's (the job).
- llama.cpp (`--peers llamacpp`, from `--lcp`: `shared/device/prepare_llamacpp.sh`'s folder):
  llama-server with every layer on the GPU and flash attention, `--concurrency` requests at once,
  `n_predict` = --max-tokens, temperature 0, the prompt cache off; the time from the first request
  to the last answer (the job), after the server is up (its start-up reported apart).

Each side's completions are compared with gemma-batch's first run (the share of identical
texts). Writes DIR/real_labelling.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
HELD_OUT = REPO / "sample_data" / "kjv-heldout.txt"
QUESTION = "\nTopic in one word:"

HF_SCRIPT = r"""
import json, sys, time
started = time.perf_counter()
import torch
from pathlib import Path
from transformers import AutoModelForCausalLM, AutoTokenizer
gguf, prompts, batch, new, out = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rows = [json.loads(line) for line in open(prompts)]
tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
tok.padding_side = "left"
device = "cuda" if torch.cuda.is_available() else "cpu"  # (the CPU: a smoke test)
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16,
                                             attn_implementation="sdpa").to(device).eval()
sync(); loaded = time.perf_counter()
order = sorted(range(len(rows)), key=lambda i: len(tok(rows[i]["prompt"]).input_ids))
texts = [None] * len(rows)
with torch.no_grad():
    for b in range(0, len(order), batch):
        idx = order[b:b + batch]
        enc = tok([rows[i]["prompt"] for i in idx], return_tensors="pt", padding=True).to(device)
        gen = model.generate(**enc, max_new_tokens=new, do_sample=False, pad_token_id=tok.pad_token_id)
        for i, seq in zip(idx, gen[:, enc.input_ids.shape[1]:].tolist()):
            texts[i] = tok.decode([t for t in seq if t not in (tok.eos_token_id, tok.pad_token_id)])
sync(); done = time.perf_counter()
json.dump({"load_s": loaded - started, "job_s": done - loaded, "texts": texts}, open(out, "w"))
"""


def write_prompts(path: Path, rows: int, words: int) -> None:
    passages = [p.split() for p in HELD_OUT.read_text().split("\n\n") if len(p.split()) > words]
    seen, lines, k = set(), [], 0
    while len(lines) < rows:
        for p, passage in enumerate(passages):
            start = 7 * k % (len(passage) - words)
            if (p, start) in seen:
                continue
            seen.add((p, start))
            lines.append(json.dumps({"id": f"row-{len(lines)}", "prompt": " ".join(passage[start:start + words]) + QUESTION}))
            if len(lines) == rows:
                break
        k += 1
        if k > 10_000:
            raise SystemExit(f"the held-out text holds fewer than {rows} distinct windows of {words} words")
    path.write_text("\n".join(lines) + "\n")


def run_gemma_batch(args: argparse.Namespace, prompts: Path, extra: str, n: int) -> dict:
    output = args.out / f"gemma-batch-{n}.parquet"
    command = [sys.executable, "-m", "gemma_batch", "run", str(prompts), "--model", str(args.model), "--output",
               str(output), "--max-tokens", str(args.max_tokens), "--force", *shlex.split(extra)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    (args.out / f"gemma-batch-{n}.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"{shlex.join(command)} failed:\n{done.stderr[-3000:]}")
    stats = pq.read_table(output.with_suffix(".stats.parquet")).to_pylist()[0]
    texts = [r["completion"] for r in pq.read_table(output).to_pylist()]
    return {"side": "gemma-batch", "flags": extra, "command": shlex.join(command), "process_s": seconds,
            "job_s": stats["wall_seconds"], "stats": stats, "texts": texts}


def run_transformers(args: argparse.Namespace, prompts: Path) -> dict:
    out = args.out / "transformers.json"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", HF_SCRIPT, str(args.model), str(prompts), str(args.hf_batch),
                           str(args.max_tokens), str(out)], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    (args.out / "transformers.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"transformers failed:\n{done.stderr[-3000:]}")
    result = json.loads(out.read_text())
    return {"side": "transformers", "flags": f"bf16, sdpa, batches of {args.hf_batch} by length", "process_s": seconds,
            "job_s": result["job_s"], "load_s": result["load_s"], "texts": result["texts"]}


def run_llamacpp(args: argparse.Namespace, prompts: Path) -> dict:
    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    work = Path(tempfile.mkdtemp())
    subprocess.run(["tar", "xJf", str(args.lcp / "llama-server-bin.tar.xz"), "-C", str(work)], check=True)
    context = args.concurrency * 1024
    command = [str(work / "bin" / "llama-server"), "-m", str(args.model), "-ngl", "99", "--parallel", str(args.concurrency),
               "-c", str(context), "-fa", "on", "--port", "8093", "--host", "127.0.0.1"]
    started = time.perf_counter()
    server = subprocess.Popen(command, stdout=open(args.out / "llamacpp.log", "w"), stderr=subprocess.STDOUT,
                              env={**os.environ, "LD_LIBRARY_PATH": str(work / "bin")})
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen("http://127.0.0.1:8093/health", timeout=2)
                break
            except OSError:
                if server.poll() is not None:
                    break
                time.sleep(0.5)
        else:
            raise SystemExit(f"llama-server did not come up; see {args.out / 'llamacpp.log'}")
        if server.poll() is not None:
            raise SystemExit(f"llama-server exited ({server.returncode}); see {args.out / 'llamacpp.log'}")
        up = time.perf_counter()
        texts: list = [None] * len(rows)
        queue = list(range(len(rows)))
        lock = threading.Lock()

        errors: list[BaseException] = []

        def worker() -> None:
            try:
                while True:
                    with lock:
                        if not queue or errors:
                            return
                        i = queue.pop(0)
                    body = {"prompt": rows[i]["prompt"], "n_predict": args.max_tokens, "temperature": 0.0,
                            "cache_prompt": False}
                    req = urllib.request.Request("http://127.0.0.1:8093/completion", data=json.dumps(body).encode(),
                                                 headers={"Content-Type": "application/json"})
                    with urllib.request.urlopen(req, timeout=600) as r:
                        texts[i] = json.loads(r.read())["content"]
            except BaseException as e:  # (raised again below, in the main thread)
                errors.append(e)

        threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
        begin = time.perf_counter()
        [t.start() for t in threads]
        [t.join() for t in threads]
        end = time.perf_counter()
        if errors:
            raise SystemExit(f"a request to llama-server failed: {errors[0]!r}")
    finally:
        server.terminate()
        server.wait()
    return {"side": "llama.cpp", "flags": f"Vulkan llama-server, {args.concurrency} concurrent, -ngl 99 -fa on",
            "command": shlex.join(command), "process_s": end - started, "start_s": up - started, "job_s": end - begin,
            "texts": texts}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a Gemma 3 GGUF file")
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--words", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--flags", action="append", default=None, help="gemma-batch run flags of one job (repeatable)")
    parser.add_argument("--peers", default="", help="comma-separated: transformers, llamacpp")
    parser.add_argument("--hf-batch", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--lcp", type=Path, default=REPO / ".lcp")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    prompts = args.out / "prompts.jsonl"
    write_prompts(prompts, args.rows, args.words)
    runs = [run_gemma_batch(args, prompts, extra, n) for n, extra in enumerate(args.flags or [""])]
    peers = [p for p in args.peers.split(",") if p]
    if "transformers" in peers:
        runs.append(run_transformers(args, prompts))
    if "llamacpp" in peers:
        runs.append(run_llamacpp(args, prompts))
    first = runs[0]["texts"]
    print(f"{args.rows} prompts of {args.words} words + '{QUESTION.strip()}', {args.max_tokens} new tokens, greedy; "
          f"model {args.model.name}")
    print(f"{'side':<12} {'flags':<52} {'job s':>8} {'process s':>10} {'same text as gemma-batch':>25}")
    for run in runs:
        same = sum(a == b for a, b in zip(first, run["texts"])) / len(first)
        run["same_as_gemma_batch"] = same
        print(f"{run['side']:<12} {run['flags'][:52]:<52} {run['job_s']:>8.2f} {run['process_s']:>10.2f} {100 * same:>24.1f}%")
    (args.out / "real_labelling.json").write_text(json.dumps({"argv": argv, "runs": runs}, indent=1, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
