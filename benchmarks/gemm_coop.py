"""The fp16 matrix throughput of a plain cooperative-matrix GEMM on this device (the prefill yardstick).

    python benchmarks/gemm_coop.py [--shape 4b] [--tokens 16384] [--json out.json]

Runs `benchmarks/gemm_coop.comp` (C = A . B^T, fp16 in, fp32 sums, 128 x 128 tiles: see its
header), first checked against numpy on a small problem, then timed (GPU timestamps, best of 5,
random inputs)
on the shapes of the model's matmuls for `--tokens` rows: q/k/v, o, gate+up and down as one
GEMM each, plus a square 4096 GEMM. Prints TFLOP/s per GEMM and over the layer's four GEMMs.
Needs a device with cooperative matrices (`gemma-batch devices` says "fp16 tiles").
The SPIR-V is committed beside the source; rebuild it with
    glslang -V --target-env vulkan1.2 -S comp benchmarks/gemm_coop.comp -o benchmarks/gemm_coop.spv
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from gemma_batch.backends.vulkan import push_constants, variants  # noqa: E402
from gemma_batch.backends.vulkan.device import Device  # noqa: E402
from gemma_batch.backends.vulkan.kernels import Kernels  # noqa: E402
from gemma_batch.backends.vulkan.variants import Variant  # noqa: E402
from gemma_batch.backends.vulkan.memory import Memory  # noqa: E402
from gemma_batch.backends.vulkan.timestamps import best_dispatch_seconds  # noqa: E402
from gemma_batch.bench.shapes import shape_config  # noqa: E402



@dataclass(frozen=True)
class BenchVariant(Variant):
    """A kernel whose SPIR-V lies outside gemma_batch's spv/."""

    path: Path = HERE / "gemm_coop.spv"

    @property
    def spv(self) -> Path:
        return self.path


def register(spv: Path, name: str = "gemm_coop") -> None:
    """Make the kernel built at `spv` (push constants M, N, K, pad: the GEMM's) kernel `name`, one
    `Kernels` can build and record (benchmark only)."""
    push_constants.PUSH[name] = np.dtype([("M", np.uint32), ("N", np.uint32), ("K", np.uint32), ("pad", np.uint32)])
    variants.VARIANTS[name] = BenchVariant(name, name, (), "glslang", spv)


def run_gemm(kern: Kernels, mem: Memory, M: int, N: int, K: int, tile: tuple[int, int], a: np.ndarray | None = None,
             b: np.ndarray | None = None, repeats: int = 5) -> tuple[float, np.ndarray | None]:
    """Best GPU seconds of one GEMM with (BM, BN) `tile`, and C when `a` and `b` are given (else
    random inputs, C not read)."""
    A, B, C = mem.alloc(M * K * 2, "A"), mem.alloc(N * K * 2, "B"), mem.alloc(M * N * 4, "C")
    rng = np.random.default_rng(0)
    for buf, data, rows in ((A, a, M), (B, b, N)):
        if data is None:
            block = rng.standard_normal(min(rows * K, 1 << 24)).astype(np.float16)
            for start in range(0, rows * K, block.size):
                n = min(block.size, rows * K - start)
                mem.upload(buf, block[:n], offset=2 * start)
        else:
            mem.upload(buf, data.astype(np.float16))
    try:
        dset = kern.descriptor_set({0: A, 1: B, 2: C}, C)
        best = best_dispatch_seconds(kern, "gemm_coop", dset, {"M": M, "N": N, "K": K, "pad": 0},
                                     (M // tile[0]) * (N // tile[1]), repeats)
        out = mem.download(C, M * N * 4).view(np.float32).reshape(M, N) if a is not None else None
        return best, out
    finally:
        for buf in (A, B, C):
            mem.free(buf)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="4b")
    parser.add_argument("--tokens", type=int, default=32 * 512)
    parser.add_argument("--json")
    parser.add_argument("--spv", type=Path, default=HERE / "gemm_coop.spv", help="another build of gemm_coop.comp")
    parser.add_argument("--tile", default="128x128", help="its BM x BN")
    args = parser.parse_args()
    register(args.spv)
    tile = tuple(int(t) for t in args.tile.split("x"))
    dev = Device(None)
    if not dev.coopmat:
        sys.exit(f"{dev.info.name} has no usable cooperative matrices (see `gemma-batch devices`)")
    mem, kern = Memory(dev), Kernels(dev)

    rng = np.random.default_rng(1)
    M, N, K = 2 * tile[0], 2 * tile[1], 128
    a, b = rng.standard_normal((M, K)).astype(np.float16), rng.standard_normal((N, K)).astype(np.float16)
    _, c = run_gemm(kern, mem, M, N, K, tile, a, b)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    err = float(np.abs(c - want).max() / np.abs(want).max())
    print(f"check against numpy ({M} x {N} x {K}): max error {err:.2e} of the largest |C|")
    if err > 1e-5:  # fp16 products are exact in fp32; only the fp32 sums round
        sys.exit("the GEMM is wrong on this device; no timings")

    cfg = shape_config(args.shape)
    T, H, I = args.tokens, cfg.hidden_size, cfg.intermediate_size
    gemms = {"square 4096": (4096, 4096, 4096), "qkv": (T, cfg.q_width + 2 * cfg.kv_width, H),
             "o": (T, H, cfg.q_width), "gate+up": (T, 2 * I, H), "down": (T, H, I)}
    rows, layer_flops, layer_s = [], 0.0, 0.0
    for name, (M, N, K) in gemms.items():
        if M % tile[0] or N % tile[1] or K % 64:
            print(f"{name}: {M} x {N} x {K} does not fit the tiles; skipped")
            continue
        seconds, _ = run_gemm(kern, mem, M, N, K, tile)
        flops = 2 * M * N * K
        rows.append({"gemm": name, "M": M, "N": N, "K": K, "ms": seconds * 1e3, "tflops": flops / seconds / 1e12})
        if name != "square 4096":
            layer_flops, layer_s = layer_flops + flops, layer_s + seconds
        print(f"{name:12s} {M:6d} x {N:6d} x {K:6d}: {seconds * 1e3:8.3f} ms, {flops / seconds / 1e12:7.1f} TFLOP/s")
    if layer_s:
        print(f"{args.shape} layer GEMMs at {T} tokens: {layer_flops / layer_s / 1e12:.1f} TFLOP/s")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": dev.info.name, "driver": dev.info.driver, "shape": args.shape,
                                               "tokens": T, "gemms": rows,
                                               "layer_tflops": layer_flops / layer_s / 1e12 if layer_s else None}, indent=1))


if __name__ == "__main__":
    main()
