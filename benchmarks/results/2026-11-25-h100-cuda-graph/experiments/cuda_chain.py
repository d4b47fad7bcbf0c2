"""Experiment: what dependent kernels cost in a CUDA graph, on the same GPU as the Vulkan backend.

1. A chain of 136 dependent small kernels replayed from a CUDA graph, at 1, 20, 132 and 528 blocks
   of 128 threads (each block adds 1 to its own 128 floats): microseconds a kernel. The Vulkan
   counterpart is codesize.py's "no rounds" line (../../2026-11-24-h100-code-size/).
2. The read floor of `benchmarks/read_floor.py`, as a CUDA graph: a 4b step of plain reads, one
   kernel per weight matrix (qkv, o, gate and up, down; 34 layers, then the LM head), each from
   one of up to 6 copies so that reads come from device memory, not L2, at several grid sizes
   (blocks of 256 threads, a grid-stride loop, one partial sum a thread written out).

    python3 benchmarks/results/2026-11-25-h100-cuda-graph/experiments/cuda_chain.py
"""
import statistics
import time

import torch
import triton
import triton.language as tl

CHAIN = 136
LAYERS = 34
MATRICES = {"qkv": 2560 * 4096 * 2, "o": 2048 * 2560 * 2, "gate/up": 2 * 2560 * 10240 * 2, "down": 10240 * 2560 * 2}
LM_HEAD = 262208 * 2560 * 2
COPIES, COPY_BYTES = 6, 2 << 30


@triton.jit
def bump(x_ptr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets) + 1.0)


@triton.jit
def read(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    start = tl.program_id(0) * BLOCK
    step = tl.num_programs(0) * BLOCK
    acc = tl.zeros([BLOCK], tl.float32)
    for base in range(start, n, step):
        offsets = base + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    tl.store(out_ptr + start + tl.arange(0, BLOCK), acc)


def replay_us(graph: torch.cuda.CUDAGraph, repeats: int = 20) -> float:
    """Median microseconds of one replay, after 0.5 s of replays (an idle H100 sits at 345 MHz)."""
    started = time.perf_counter()
    while time.perf_counter() - started < 0.5:
        graph.replay()
        torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


def captured(launch) -> torch.cuda.CUDAGraph:
    launch()  # compiles
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    return graph


def chain_us(blocks: int) -> float:
    x = torch.zeros(blocks * 128, device="cuda")
    return replay_us(captured(lambda: [bump[(blocks,)](x, BLOCK=128) for _ in range(CHAIN)])) / CHAIN


def read_step_ms(buffers: dict, lm_head: torch.Tensor, sink: torch.Tensor, groups: int) -> float:
    def launch() -> None:
        for layer in range(LAYERS):
            for copies in buffers.values():
                x = copies[layer % len(copies)]
                read[(groups,)](x, sink, x.numel(), BLOCK=1024, num_warps=8)
        read[(groups,)](lm_head, sink, lm_head.numel(), BLOCK=1024, num_warps=8)
    return replay_us(captured(launch)) / 1000


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    for rnd in range(2):
        print(f"round {rnd}, chain of {CHAIN} dependent kernels: "
              + ", ".join(f"{b} blocks {chain_us(b):.2f} us/kernel" for b in (1, 20, 132, 528)), flush=True)
    buffers = {name: [torch.ones(n // 4, device="cuda") for _ in range(max(2, min(COPIES, COPY_BYTES // n)))]
               for name, n in MATRICES.items()}
    lm_head = torch.ones(LM_HEAD // 4, device="cuda")
    sink = torch.empty(8192 * 1024, device="cuda")
    weights = LAYERS * sum(MATRICES.values()) + LM_HEAD
    for rnd in range(2):
        for groups in (264, 528, 1056, 2112):
            ms = read_step_ms(buffers, lm_head, sink, groups)
            print(f"round {rnd}, 4b read step in a CUDA graph, {groups} blocks of 256: {ms:.3f} ms "
                  f"({weights / ms / 1e6:,.1f} GB/s over {weights / 1e9:.2f} GB)", flush=True)


if __name__ == "__main__":
    main()
