"""Where the host part of a Vulkan decode step goes: Python, the submit call, the fence wait.

    python benchmarks/host_time.py 4b [--batch 1,32] [--prompt-len 128] [--gen-len 64] [--wait block|spin]

Runs the engine as `decode_profile.py` does, with the device's `submit` and `wait` replaced by
the same calls, timed. Per batch size, medians over the decode steps of: the step's wall time,
its GPU time (timestamps), the host's part (wall - GPU: what the host adds to the step), the
vkQueueSubmit call, the fence wait, and the rest (Python: result handling, buffer writes, and
the next step's scheduling, which the engine does between submit and wait, while the GPU runs).
`--wait block` (default) blocks on the fence as `Device.wait` does; `--wait spin` polls it, to
see what the wake-up costs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gemma_batch.backends.vulkan import VulkanBackend  # noqa: E402
from gemma_batch.bench.random_weights import random_tensors  # noqa: E402
from gemma_batch.bench.runner import prefilled_engine  # noqa: E402
from gemma_batch.bench.shapes import shape_config  # noqa: E402


def timed_device(backend: VulkanBackend, wait: str, out: dict[str, float]) -> None:
    """Time the device's `submit` and `wait` into `out`; with `wait` "spin", poll the fence
    instead of blocking on it."""
    dev, vk = backend.device, backend.device.vk
    own_submit, own_wait = dev.submit, dev.wait

    def submit(cb, fence: int = 0) -> None:
        t0 = time.perf_counter()
        own_submit(cb, fence)
        out["submit"] = time.perf_counter() - t0

    def wait_fence(fence: int = 0) -> None:
        t0 = time.perf_counter()
        if wait == "spin":
            while True:
                try:
                    vk.vkGetFenceStatus(dev.device, dev.fences[fence])  # raises VkNotReady until signalled
                    break
                except vk.VkNotReady:
                    pass
        own_wait(fence)  # returns at once after the spin (and resets the fence)
        out["wait"] = time.perf_counter() - t0

    dev.submit, dev.wait = submit, wait_fence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape")
    parser.add_argument("--batch", default="1,32")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--gen-len", type=int, default=64)
    parser.add_argument("--wait", choices=("block", "spin"), default="block")
    args = parser.parse_args()
    cfg = shape_config(args.shape)
    backend = VulkanBackend(cfg)
    backend.load_weights(random_tensors(cfg, 0))
    calls: dict[str, float] = {}
    timed_device(backend, args.wait, calls)
    for batch in (int(b) for b in args.batch.split(",")):
        engine = prefilled_engine(backend, batch, args.prompt_len, args.gen_len)
        rows = []
        while engine.num_unfinished:
            start = time.perf_counter()
            engine.step()
            rows.append((time.perf_counter() - start, backend.last_step_device_seconds(), calls["submit"], calls["wait"]))
        wall, gpu, submit, wait = np.median(np.array(rows[2:]), axis=0) * 1e3
        print(f"{args.shape} batch {batch} (--wait {args.wait}): step {wall:.3f} ms, GPU {gpu:.3f}, host {wall - gpu:.3f} "
              f"(wall - GPU); submit call {submit:.3f}, fence wait {wait:.3f}, Python {wall - submit - wait:.3f} "
              f"(with the next step's scheduling, which runs while the GPU does)")


if __name__ == "__main__":
    main()
