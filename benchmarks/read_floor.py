"""The floor of a decode step whose matmuls are one dispatch per weight matrix: how long one
dispatch takes to read each of a shape's matrices once.

    python benchmarks/read_floor.py 4b [--groups 264,396,528,1056,2112,4096]

For each matrix of the shape (qkv, o, gate and up together, down, the LM head; 2 bytes a weight,
as the fp16 tiles the cooperative path streams), `shaders/read_bandwidth.comp` reads a buffer of
that size once per dispatch, dispatches chained with a barrier between them over distinct
buffers (so every read comes from device memory, not L2) and timestamps between them; the median
gap per grid size, the best grid kept. That is a read with nothing else to do: no matrix work, no
dependent loads. (Each grid's command buffer starts with WARM_READS reads of 1 GiB, so that no host gap
lets the clocks fall before the timed reads.) Then the layer's sum, the step's (layers x layer + LM head), and that step as a
fraction of the streaming bandwidth measured the bench's way (1 GiB read 4 times): the highest
bandwidth fraction a batch-1 step of one dispatch per matrix could reach if everything else in
the step took no time. Needs a Vulkan device (run it on the GPU machine).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from gemma_batch.backends.vulkan.bandwidth import GROUPS, measure_read_bandwidth
from gemma_batch.backends.vulkan.device import Device
from gemma_batch.backends.vulkan.kernels import Kernels
from gemma_batch.backends.vulkan.memory import Memory
from gemma_batch.backends.vulkan.timestamps import Timestamps
from gemma_batch.bench.shapes import shape_config
from gemma_batch.model.weights import layer_tensor_shapes

WARMUP_SECONDS = 0.5  # the bench's: an idle GPU's clocks take a fraction of a second to rise
BIG = 1 << 30
WARM_READS = 4  # reads of the warm-up buffer at the head of each timed command buffer
COPIES, COPY_BYTES = 6, 2 << 30  # distinct buffers per matrix: up to 6, up to 2 GiB of them


# A layer's matmul dispatches and the checkpoint weights each one streams.
LAYER = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o": ("self_attn.o_proj",),
         "gate/up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}


def matrices(shape: str) -> tuple[int, dict[str, int]]:
    """(layers, bytes each dispatch of LAYER and the LM head reads at 2 bytes a weight)."""
    cfg = shape_config(shape)
    shapes = layer_tensor_shapes(cfg)
    sizes = {name: sum(2 * int(np.prod(shapes[f"{w}.weight"])) for w in weights) for name, weights in LAYER.items()}
    return cfg.num_layers, {**sizes, "lm head": 2 * cfg.vocab_size * cfg.hidden_size}


class Reads:
    """Chains of read_bandwidth dispatches, timed per dispatch on the GPU."""

    def __init__(self, dev: Device) -> None:
        self.dev, self.vk = dev, dev.vk
        self.kern, self.mem = Kernels(dev), Memory(dev)
        self.sink = self.mem.alloc(4 * 8192 * 256, "sink")

    def chains_us(self, warm: tuple, chains: dict[str, tuple[list, int]], groups: int, repeats: int = 5) -> dict[str, float]:
        """Per chain name, the median GPU microseconds of its dispatches after the first: one
        command buffer that first reads `warm` (buffer, bytes) WARM_READS times (the clocks stay up: no
        host gap before the timed reads), then per chain each of its buffers once, twice round."""
        vk, kern = self.vk, self.kern
        items = [(None, *warm)] * WARM_READS + [(name, buf, n) for name, (bufs, n) in chains.items() for buf in bufs * 2]
        stamps = Timestamps(self.dev, len(items) + 1)
        cb = self.dev.command_buffer()
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))
        stamps.reset(cb)
        stamps.write(cb, 0)
        for i, (_, buf, n) in enumerate(items):
            dset = kern.descriptor_set({0: buf, 1: self.sink}, self.sink)
            kern.record_direct(cb, "read_bandwidth", dset, {"n": n // 16, "iterations": 1}, GROUPS if i < WARM_READS else groups)
            stamps.write(cb, i + 1)
        vk.vkEndCommandBuffer(cb)
        gaps = []
        for _ in range(repeats):
            self.dev.submit_and_wait(cb)
            gaps.append(stamps.seconds(len(items) + 1))
        vk.vkFreeCommandBuffers(self.dev.device, self.dev.command_pool, 1, [cb])
        kern.reset_sets()
        stamps.free()
        per_item = np.median(np.array(gaps), axis=0) * 1e6
        out: dict[str, float] = {}
        for name in chains:
            mine = [t for (label, _, _), t in zip(items, per_item) if label == name]
            out[name] = float(np.median(mine[1:]))
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape")
    parser.add_argument("--groups", default="264,396,528,1056,2112,4096", help="grid sizes (x 256 invocations) to try")
    args = parser.parse_args()
    layers, sizes = matrices(args.shape)
    dev = Device()
    reads = Reads(dev)
    print(f"{dev.info.name}; shape {args.shape}: {layers} layers", flush=True)
    bandwidth = measure_read_bandwidth(reads.kern, reads.mem, BIG)
    warm = min(BIG, dev.info.max_storage_buffer_range) // 16 * 16
    big = reads.mem.alloc(warm, "warm-up")
    chains = {name: ([reads.mem.alloc(n, name) for _ in range(max(2, min(COPIES, COPY_BYTES // n)))], n)
              for name, n in sizes.items()}
    start = time.perf_counter()
    while time.perf_counter() - start < WARMUP_SECONDS:
        reads.chains_us((big, warm), {}, GROUPS, repeats=1)
    best: dict[str, tuple[float, int]] = {}
    for groups in (int(g) for g in args.groups.split(",")):
        for name, us in reads.chains_us((big, warm), chains, groups).items():
            if name not in best or us < best[name][0]:
                best[name] = (us, groups)
    for name, nbytes in sizes.items():
        us, groups = best[name]
        print(f"  {name:8s} {nbytes / 1e6:9.2f} MB  {us:8.1f} us  {nbytes / us / 1e3:8.1f} GB/s  (best of --groups: {groups})")
    layer = sum(best[k][0] for k in LAYER)
    layer_bytes = sum(sizes[k] for k in LAYER)
    step = layers * layer + best["lm head"][0]
    weights = layers * layer_bytes + sizes["lm head"]
    print(f"streaming bandwidth (the bench's measurement): {bandwidth / 1e9:,.1f} GB/s", flush=True)
    print(f"one layer's four reads: {layer:.1f} us (at the streaming bandwidth: "
          f"{layer_bytes / bandwidth * 1e6:.1f} us)")
    print(f"a step of these reads alone: {step / 1e3:.3f} ms = {weights / (step * 1e-6) / bandwidth:.1%} of the streaming "
          f"roofline (weights {weights / 1e9:.2f} GB; a batch-1 step's KV reads not counted)")


if __name__ == "__main__":
    main()
