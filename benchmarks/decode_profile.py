"""GPU time per kernel of a Vulkan decode step, at a real Gemma 3 shape on random weights.

    python benchmarks/decode_profile.py 1b [--batch 1,8,32] [--prompt-len 128] [--gen-len 64]
                                           [--weights bf16|fp16|int8|int4] [--int4-group 32|64]
                                           [--layer]

Per batch size: a warm-up (the same run, repeated for at least the bench's WARMUP_SECONDS, so
that the GPU's clocks have risen), then prefill `batch` random prompts in the bench's steps (one,
up to 8,192 tokens), decode to `gen-len` tokens, and print the last prefill step's GPU time by
kernel; then, over the steps that decoded the whole batch (a multi-step prefill lets the first
prompts decode early: `gen-len` must outlast it), the median step (wall), the last such step's GPU
time by kernel (timestamps after every dispatch, `VulkanBackend(profile=True)`), and the weight
bytes streamed per second; with `--layer`, also that step's dispatches of a layer in order (from
one decode attention dispatch to the next, each the mean over the layers that ran the same
kernels), which shows what a kernel costs where it runs rather than summed. Complements
`gemma-batch bench` (whole-run figures) when deciding which kernel to work on.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from gemma_batch.backends.vulkan import VulkanBackend
from gemma_batch.bench.random_weights import random_tensors, weight_bytes
from gemma_batch.bench.runner import prefilled_engine, step_budget, warm_up
from gemma_batch.bench.shapes import shape_config
from gemma_batch.model.quant import FORMATS, WeightFormat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape")
    parser.add_argument("--batch", default="1,8,32")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--gen-len", type=int, default=64)
    parser.add_argument("--weights", default="bf16", choices=FORMATS)
    parser.add_argument("--int4-group", type=int, default=32)
    parser.add_argument("--layer", action="store_true", help="also a layer's dispatches in order")
    args = parser.parse_args()
    cfg = shape_config(args.shape)
    fmt = WeightFormat.parse(args.weights, args.int4_group)
    backend = VulkanBackend(cfg, profile=True)
    backend.load_weights(random_tensors(cfg, 0, fmt))
    nbytes = weight_bytes(cfg, fmt)
    for batch in (int(b) for b in args.batch.split(",")):
        def one_round() -> None:
            warm = prefilled_engine(backend, batch, args.prompt_len, args.gen_len)
            while warm.num_unfinished:
                warm.step()

        warm_up(one_round)
        engine = prefilled_engine(backend, batch, args.prompt_len, args.gen_len)
        prefill = backend.profile_seconds()
        print(f"{args.shape} {fmt} batch {batch}: prefill of {batch * args.prompt_len} tokens in steps of up "
              f"to {step_budget(batch, args.prompt_len)}; its last step: GPU {sum(prefill.values()) * 1e3:.2f} ms; "
              f"GPU ms by kernel: {by_kernel(prefill)}")
        times, decode, timeline = [], {}, []
        while engine.num_unfinished:  # time the steps that decode the whole batch
            generated, start = engine.stats.generated_tokens, time.perf_counter()
            engine.step()
            if engine.stats.generated_tokens - generated == batch:
                times.append(time.perf_counter() - start)
                decode, timeline = backend.profile_seconds(), backend.profile_timeline()
        if len(times) < 3:
            print(f"{args.shape} {fmt} batch {batch}: {len(times)} steps decoded the whole batch; "
                  f"raise --gen-len past the prefill's steps")
            continue
        step = float(np.median(times[2:]))
        print(f"{args.shape} {fmt} batch {batch}: decode step {step * 1e3:.2f} ms ({len(times)} steps of the whole "
              f"batch), {batch / step:.0f} tok/s, weights {nbytes / step / 1e9:.0f} GB/s; "
              f"GPU ms by kernel: {by_kernel(decode)}")
        if args.layer:
            layer, count = layer_dispatches(timeline)
            print(f"{args.shape} {fmt} batch {batch}: a layer's dispatches in order, GPU us (mean of {count} "
                  f"layers): " + ", ".join(f"{name} {sec * 1e6:.1f}" for name, sec in layer))


def layer_dispatches(timeline: list[tuple[str, float]]) -> tuple[list[tuple[str, float]], int]:
    """A decode step's dispatches of a layer, from one attention dispatch to the next, each the mean
    over the layers whose dispatches were the same kernels as the middle layer's; and how many
    layers those were."""
    starts = [i for i, (name, _) in enumerate(timeline) if name.startswith("attention") and "flash" not in name]
    layers = [timeline[a:b] for a, b in zip(starts, starts[1:])]
    if not layers:
        return [], 0
    names = [name for name, _ in layers[len(layers) // 2]]
    same = [layer for layer in layers if [name for name, _ in layer] == names]
    return [(name, sum(layer[i][1] for layer in same) / len(same)) for i, name in enumerate(names)], len(same)


def by_kernel(seconds: dict[str, float]) -> str:
    """`profile_seconds` as "name ms, name ms, ..."."""
    return ", ".join(f"{k} {v * 1e3:.3f}" for k, v in seconds.items())


if __name__ == "__main__":
    main()
