"""The peer of `gemma-batch bench`: Hugging Face transformers on the same Gemma 3 shape.

`Gemma3ForCausalLM` built from the very shape dict the bench uses (`gemma_batch.bench.shapes`),
random bf16 weights (transformers' own initialisation), or a real model (`--model`: a Hugging
Face folder, or a GGUF file that transformers dequantizes itself; side_by_side.py passes the GGUF
of a GGUF model, the folder of a hub name) in bf16, sdpa attention, on CUDA (on the CPU when
there is none, for a smoke test). Per batch size: a warm-up of the same batch, then
the timed greedy `generate` of exactly --gen-len tokens (min_new_tokens = max_new_tokens, no
eos), then one prefill forward alone. Prints a line per case and writes JSON.

    python benchmarks/hf_peer.py --shape 1b --batch 1,8,32 --prompt-len 128 --gen-len 128 --json hf.json
    python benchmarks/hf_peer.py --model gemma-3-270m-q4_k_m.gguf --batch 64 --json hf.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
from gemma_batch.bench.runner import warm_up  # noqa: E402
from gemma_batch.bench.shapes import SHAPES  # noqa: E402

WARMUP_TOKENS = 4


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="1b", choices=list(SHAPES))
    parser.add_argument("--model", type=Path, help="a Hugging Face model folder instead of random weights of --shape")
    parser.add_argument("--batch", default="1,8,32", help="comma-separated batch sizes")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--gen-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the report here")
    return parser.parse_args(argv)


def build_model(shape: str, seed: int, device: str) -> Gemma3ForCausalLM:
    """`Gemma3ForCausalLM` of bench shape `shape`: random bf16 weights (seeded), sdpa, on `device`."""
    torch.manual_seed(seed)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = Gemma3ForCausalLM(Gemma3TextConfig(**SHAPES[shape], attn_implementation="sdpa")).eval()
    synchronize(device)
    return model


def load_model(path: Path, device: str) -> Gemma3ForCausalLM:
    """The model at `path` (a Hugging Face folder, or a .gguf file), bf16, sdpa, on `device`."""
    where = {"pretrained_model_name_or_path": path.parent, "gguf_file": path.name} if path.suffix == ".gguf" else \
        {"pretrained_model_name_or_path": path}
    model = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.bfloat16, attn_implementation="sdpa").to(device)
    synchronize(device)
    return model.eval()


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_case(model: Gemma3ForCausalLM, device: str, batch: int, prompt_len: int, gen_len: int,
              generator: torch.Generator) -> dict:
    """One batch size: warm-up (a short `generate` and a prefill, repeated for at least
    WARMUP_SECONDS, as `gemma-batch bench` does), timed `generate`, timed prefill forward."""
    cfg = model.config
    ids = torch.randint(3, cfg.vocab_size, (batch, prompt_len), generator=generator).to(device)  # [B, P]
    ids[:, 0] = cfg.bos_token_id
    mask = torch.ones_like(ids)
    greedy = dict(do_sample=False, pad_token_id=cfg.pad_token_id, eos_token_id=None)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        def one_round() -> None:
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=WARMUP_TOKENS,
                           min_new_tokens=WARMUP_TOKENS, **greedy)
            model(input_ids=ids, attention_mask=mask, logits_to_keep=1)
            synchronize(device)

        warm_up(one_round)
        start = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=gen_len, min_new_tokens=gen_len,
                             **greedy)  # [B, P + G]
        synchronize(device)
        wall = time.perf_counter() - start
        start = time.perf_counter()
        model(input_ids=ids, attention_mask=mask, logits_to_keep=1)
        synchronize(device)
        prefill = time.perf_counter() - start
    generated = batch * (out.shape[1] - prompt_len)
    if generated != batch * gen_len:
        raise RuntimeError(f"generate gave {out.shape[1] - prompt_len} tokens per sequence, not {gen_len}")
    return {
        "batch": batch,
        "prompt_len": prompt_len,
        "gen_len": gen_len,
        "generated_tokens": generated,
        "wall_s": wall,
        "e2e_tokens_per_s": generated / wall,
        "prefill_s": prefill,
        "prefill_tokens_per_s": batch * prompt_len / prefill,
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
    }


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    model = load_model(args.model, device) if args.model else build_model(args.shape, args.seed, device)
    shape = str(args.model) if args.model else args.shape
    load_s = time.perf_counter() - started
    generator = torch.Generator().manual_seed(args.seed)
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"transformers {transformers.__version__}, torch {torch.__version__} on {name}; {'model' if args.model else 'shape'} {shape}, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters, bf16, sdpa", file=sys.stderr)
    cases = []
    for batch in (int(b) for b in args.batch.split(",")):
        case = time_case(model, device, batch, args.prompt_len, args.gen_len, generator)
        cases.append(case)
        print(f"transformers shape={shape} batch={batch} prompt={args.prompt_len} new={args.gen_len}: "
              f"{case['e2e_tokens_per_s']:.1f} generated tok/s end to end ({case['wall_s']:.2f} s), "
              f"prefill alone {case['prefill_tokens_per_s']:.0f} tok/s")
    return write_report("hf_peer.py", argv, "generate", args.json, cases, {
        "device": f"{device}: {name}",
        "shape": shape,
        "config": {k: getattr(model.config.get_text_config(), k) for k in SHAPES["1b"]} if args.model else SHAPES[args.shape],
        "dtype": "bf16",
        "seed": args.seed,
        "weight_init_s": load_s,
    })


def write_report(script: str, argv: list[str], how: str, path: str | None, cases: list[dict], run: dict) -> dict:
    """A peer script's JSON report: the date, the command, transformers' and torch's versions (with
    `how` the model ran), then `run`'s fields, and the cases. Written to `path` when given."""
    report = {
        "run": {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": shlex.join(["python", f"benchmarks/{script}", *argv]),
            "peer": f"transformers {transformers.__version__}, torch {torch.__version__}, sdpa, {how}",
            **run,
        },
        "cases": cases,
    }
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
