"""A calibration for the decode targets: one decode step of the same Gemma 3 shape on CUDA, with the
launch overhead that `generate` pays taken away.

Not the issue's peer (that is `hf_peer.py`, transformers' `generate` as users run it). This asks
what fraction of the read roofline a mature CUDA stack reaches on the same GPU when nothing but the
kernels is left: transformers' `Gemma3ForCausalLM` (random bf16 weights from `hf_peer.build_model`,
sdpa, a `StaticCache` of prompt + gen tokens), one token a sequence at cache position
prompt + gen / 2 (the bench's mean decode context), greedy id written back as the next input.

Modes, per batch size:
  eager     the step as PyTorch launches it, kernel by kernel
  graph     the same kernels captured once in a CUDA graph and replayed
  compiled  `torch.compile` (inductor, fused elementwise kernels) captured in a CUDA graph
  autotuned the same with inductor's max-autotune (its own matmul kernels where they time faster)

Each mode: warm-up for at least `WARMUP_SECONDS`, then --steps steps timed one by one with CUDA
events (GPU time of the step; no host work between replays). With --bench-json (a `gemma-batch
bench` report of the same shape, batch sizes, prompt and gen lengths, from the same machine), the
fraction of the roofline uses that report's bytes per decode step and measured read bandwidth, by
the bench's own definition (`metrics.roofline_tokens_per_s`), over the median step.

    python benchmarks/cuda_graph_peer.py --shape 4b --batch 1,32 --bench-json bench.json --json cuda.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from transformers import Gemma3ForCausalLM, StaticCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hf_peer import build_model, write_report  # noqa: E402

from gemma_batch.bench.metrics import roofline_tokens_per_s  # noqa: E402
from gemma_batch.bench.runner import warm_up  # noqa: E402
from gemma_batch.bench.shapes import SHAPES  # noqa: E402

MODES = ("eager", "graph", "compiled", "autotuned")
COMPILE_MODES = {"compiled": "default", "autotuned": "max-autotune-no-cudagraphs"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="4b", choices=list(SHAPES))
    parser.add_argument("--batch", default="1,32", help="comma-separated batch sizes")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--gen-len", type=int, default=128)
    parser.add_argument("--modes", default="eager,graph,compiled", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bench-json", help="gemma-batch bench report giving bytes per step and bandwidth")
    parser.add_argument("--json", help="write the report here")
    return parser.parse_args(argv)


def decode_step(model: Gemma3ForCausalLM, batch: int, prompt_len: int, gen_len: int, device: str,
                compile_mode: str | None) -> Callable[[], None]:
    """A function that runs one decode step of `batch` sequences in place (static buffers only, so
    a CUDA graph can capture it): the token ids it reads are the ids it wrote the step before.

    Every call is the same step, at cache position prompt + gen / 2. Depending on the transformers
    version, the cache's layers count the tokens they were given (a tensor they index with, and in
    sliding-window layers a Python int too); those counts are set back to that position before
    each step, or the steps would run past the cache's end."""
    cache = StaticCache(config=model.config, max_cache_len=prompt_len + gen_len)
    position = prompt_len + gen_len // 2
    tokens = torch.full((batch, 1), 3, dtype=torch.long, device=device)  # [B, 1]
    cache_position = torch.tensor([position], device=device)  # [1]
    position_ids = cache_position.expand(batch, 1)  # [B, 1]
    counts: list[torch.Tensor] = []  # the layers' count tensors, once the first step has made them

    def forward() -> None:
        for count in counts:
            count.fill_(position)
        logits = model(input_ids=tokens, position_ids=position_ids, cache_position=cache_position,
                       past_key_values=cache, use_cache=True, logits_to_keep=1).logits  # [B, 1, V]
        tokens.copy_(logits[:, -1].argmax(-1, keepdim=True))

    forward()  # the cache makes its tensors at the first update: not inside a traced graph
    counts.extend(layer.cumulative_length for layer in cache.layers
                  if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor))
    counted_ints = [layer for layer in cache.layers if hasattr(layer, "cumulative_length_int")]
    run = forward if compile_mode is None else torch.compile(forward, mode=compile_mode)

    def step() -> None:
        for layer in counted_ints:
            layer.cumulative_length_int = position
        run()

    return step


def in_graph(step: Callable[[], None]) -> Callable[[], None]:
    """`step` captured in a CUDA graph (after three warm-up calls on a side stream, as PyTorch asks)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def time_steps(run: Callable[[], None], steps: int) -> list[float]:
    """GPU milliseconds of each of `steps` calls, from CUDA events around each."""
    warm_up(lambda: (run(), torch.cuda.synchronize()))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
    for start, end in events:
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def kernel_profile(step: Callable[[], None], steps: int = 5) -> list[dict]:
    """The GPU kernels of one step run outside a graph (PyTorch's profiler over `steps` steps):
    per kernel name, launches a step and GPU microseconds a step, longest first."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(event.name, []).append(event.device_time)
    rows = [{"name": name, "per_step": len(us) / steps, "us_per_step": sum(us) / steps} for name, us in kernels.items()]
    return sorted(rows, key=lambda row: -row["us_per_step"])


def bench_rows(path: str | None) -> tuple[float | None, dict[int, dict]]:
    """The bench report's measured bandwidth (bytes/s) and its cases by batch size."""
    if path is None:
        return None, {}
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    return report["run"]["bandwidth_bytes_per_s"], {case["batch"]: case for case in report["cases"]}


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("cuda_graph_peer.py times CUDA graphs: it needs a CUDA device")
    modes = args.modes.split(",")
    if unknown := set(modes) - set(MODES):
        raise SystemExit(f"unknown modes {sorted(unknown)}; available: {', '.join(MODES)}")
    bandwidth, bench = bench_rows(args.bench_json)
    model = build_model(args.shape, args.seed, "cuda")
    name = torch.cuda.get_device_name()
    print(f"transformers {transformers.__version__}, torch {torch.__version__} on {name}; shape {args.shape}",
          file=sys.stderr)
    cases = []
    for batch in (int(b) for b in args.batch.split(",")):
        for mode in modes:
            started = time.perf_counter()
            with torch.inference_mode():
                torch.compiler.reset()
                step = decode_step(model, batch, args.prompt_len, args.gen_len, "cuda", COMPILE_MODES.get(mode))
                step()  # compiles, in the compiled modes
                profile = kernel_profile(step) if mode != "graph" else []
                kernels = round(sum(row["per_step"] for row in profile)) if profile else None
                run = step if mode == "eager" else in_graph(step)
                times = time_steps(run, args.steps)
            case = {"batch": batch, "mode": mode, "step_ms_median": statistics.median(times),
                    "step_ms_mean": statistics.fmean(times), "step_ms_min": min(times),
                    "kernels_per_step": kernels,
                    "kernel_us_per_step": sum(row["us_per_step"] for row in profile) if profile else None,
                    "kernels": profile,
                    "setup_s": time.perf_counter() - started - sum(times) / 1000}  # with compiling and warm-up
            row = bench.get(batch)
            if row is not None and bandwidth is not None:
                case["decode_bytes_per_step"] = row["decode_bytes_per_step"]
                tokens_per_s = batch / (case["step_ms_median"] / 1000)
                case["bandwidth_fraction"] = tokens_per_s / roofline_tokens_per_s(batch, row["decode_bytes_per_step"],
                                                                                  bandwidth)
                case["gemma_batch_step_ms_median"] = row["decode_step_ms_median"]
                case["gemma_batch_bandwidth_fraction"] = row["bandwidth_fraction"]
            cases.append(case)
            fraction = f", {100 * case['bandwidth_fraction']:.1f}% of the roofline" if row and bandwidth else ""
            launched = (f"; {kernels} kernels a step, {case['kernel_us_per_step'] / 1000:.3f} ms of kernel time "
                        "outside a graph") if kernels else ""
            print(f"cuda {mode} shape={args.shape} batch={batch}: median step {case['step_ms_median']:.3f} ms "
                  f"(mean {case['step_ms_mean']:.3f}, min {case['step_ms_min']:.3f}){fraction}{launched}", flush=True)
    return write_report("cuda_graph_peer.py", argv, "StaticCache", args.json, cases, {
        "device": name,
        "shape": args.shape,
        "dtype": "bf16",
        "prompt_len": args.prompt_len,
        "gen_len": args.gen_len,
        "bandwidth_bytes_per_s": bandwidth,
    })

if __name__ == "__main__":
    main(sys.argv[1:])
