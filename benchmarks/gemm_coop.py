"""The fp16 matrix throughput of a plain cooperative-matrix GEMM on this device (the prefill yardstick),
and with --cublas cuBLAS's (`torch.matmul`, fp16 and bf16) on the same GEMMs in the same run.

    python benchmarks/gemm_coop.py [--shape 4b,27b] [--tokens 4096,16384,32768] [--cublas] [--json out.json]

Runs `benchmarks/gemm_coop.comp` (C = A . B^T, fp16 in, fp32 sums, 128 x 128 tiles: see its
header), first checked against numpy on a small problem, then timed (GPU timestamps, best of 20 submits,
random inputs) on the shapes of the model's matmuls for each `--tokens` row count: q/k/v, o, gate+up
and down as one GEMM each, plus a square 4096 GEMM. A GEMM whose fp32 C would pass the device's
largest storage buffer is left out on our side. cuBLAS runs after, in the same process (CUDA events,
best of 20 after a warm-up; C in the inputs' dtype, as `torch.matmul` gives). Prints TFLOP/s per
GEMM and over each layer's four GEMMs. Needs a device with cooperative matrices (`gemma-batch
devices` says "fp16 tiles"); --cublas needs torch with CUDA.
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
             b: np.ndarray | None = None, repeats: int = 20) -> tuple[float, np.ndarray | None]:
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


def model_gemms(shape: str, tokens: int) -> dict[str, tuple[int, int, int]]:
    """(M, N, K) of a layer's four matmuls at `tokens` rows: q/k/v, o, gate+up and down."""
    cfg = shape_config(shape)
    T, H, I = tokens, cfg.hidden_size, cfg.intermediate_size
    return {"qkv": (T, cfg.q_width + 2 * cfg.kv_width, H), "o": (T, H, cfg.q_width), "gate+up": (T, 2 * I, H),
            "down": (T, H, I)}


def cublas_seconds(M: int, N: int, K: int, dtype_name: str, repeats: int = 20) -> float:
    """Best seconds of `torch.matmul(A [M, K], B [N, K]^T)` on CUDA in `dtype_name` (fp16 or bf16)."""
    import torch

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    b = torch.randn(N, K, device="cuda", dtype=dtype)
    torch.matmul(a, b.T)  # warm-up: cuBLAS picks its kernel
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(a, b.T)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="4b", help="comma-separated shapes")
    parser.add_argument("--tokens", default=str(32 * 512), help="comma-separated row counts")
    parser.add_argument("--cublas", action="store_true", help="also time torch.matmul (fp16, bf16) on CUDA")
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

    gemms = [("-", 0, "square 4096", (4096, 4096, 4096))]
    for shape in args.shape.split(","):
        for tokens in (int(t) for t in args.tokens.split(",")):
            gemms += [(shape, tokens, name, mnk) for name, mnk in model_gemms(shape, tokens).items()]
    rows = []
    for shape, tokens, name, (M, N, K) in gemms:
        row = {"shape": shape, "tokens": tokens, "gemm": name, "M": M, "N": N, "K": K, "flops": 2 * M * N * K}
        if M % tile[0] or N % tile[1] or K % 64:
            print(f"{name}: {M} x {N} x {K} does not fit the tiles; ours skipped")
        elif M * N * 4 > dev.info.max_storage_buffer_range:
            print(f"{name}: {M} x {N} fp32 C passes the largest storage buffer; ours skipped")
        else:
            row["ours_s"] = run_gemm(kern, mem, M, N, K, tile)[0]
        rows.append(row)
    if args.cublas:
        for row in rows:
            for dtype in ("fp16", "bf16"):
                row[f"cublas_{dtype}_s"] = cublas_seconds(row["M"], row["N"], row["K"], dtype)
    sides = ["ours"] + (["cublas_fp16", "cublas_bf16"] if args.cublas else [])
    for row in rows:
        for side in sides:
            row[f"{side}_tflops"] = row["flops"] / row[f"{side}_s"] / 1e12 if f"{side}_s" in row else None
        row["ours_of_cublas_fp16"] = (row["ours_tflops"] / row["cublas_fp16_tflops"]
                                      if args.cublas and row["ours_tflops"] else None)
    layers = []
    for shape, tokens in dict.fromkeys((r["shape"], r["tokens"]) for r in rows if r["shape"] != "-"):
        layer = [r for r in rows if (r["shape"], r["tokens"]) == (shape, tokens)]
        summary = {"shape": shape, "tokens": tokens, "gemm": "layer (4 GEMMs)"}
        for side in sides:
            summary[f"{side}_tflops"] = (sum(r["flops"] for r in layer) / sum(r[f"{side}_s"] for r in layer) / 1e12
                                         if all(f"{side}_s" in r for r in layer) else None)
        layers.append(summary)

    def cell(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    print(f"{'shape':5s} {'rows':>6s} {'gemm':16s} {'M x N x K':>22s} " + " ".join(f"{s + ' TFLOP/s':>20s}" for s in sides))
    for r in rows + layers:
        mnk = f"{r['M']} x {r['N']} x {r['K']}" if "M" in r else ""
        print(f"{r['shape']:5s} {r['tokens']:6d} {r['gemm']:16s} {mnk:>22s} "
              + " ".join(f"{cell(r[f'{s}_tflops']):>20s}" for s in sides))
    if args.json:
        Path(args.json).write_text(json.dumps({"device": dev.info.name, "driver": dev.info.driver, "tile": args.tile,
                                               "gemms": rows, "layers": layers}, indent=1))


if __name__ == "__main__":
    main()
