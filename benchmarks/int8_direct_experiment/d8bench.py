"""(experiment) int8 decode matmul: staged (matmul_coop.comp) vs direct (codes in fragment order, dequantized in
registers) vs fp16 tiles direct, same values; bits compared, GPU time best of 20."""
import numpy as np
from dataclasses import dataclass
from pathlib import Path
from gemma_batch.backends.vulkan import variants
from gemma_batch.backends.vulkan.variants import Variant
from gemma_batch.backends.vulkan.device import Device
from gemma_batch.backends.vulkan.memory import Memory
from gemma_batch.backends.vulkan.kernels import Kernels, META_BINDING
from gemma_batch.backends.vulkan.timestamps import best_dispatch_seconds
from gemma_batch.backends.vulkan.coop_tiles import coop_chunks
from gemma_batch.backends.vulkan.fragment_order import ORDER, probe


@dataclass(frozen=True)
class V(Variant):
    path: Path = Path(".m/d8/coop_direct_i8.spv")

    @property
    def spv(self):
        return self.path


for n in ("coop_direct_i8", "coop_direct_i8_ns", "coop_direct_i8_nd"):
    variants.VARIANTS[n] = V(n, "matmul_coop_direct", ("W_I8",), "glslang", Path(f".m/d8/{n}.spv"))
dev = Device(None)
mem = Memory(dev)
kern = Kernels(dev, x_lo=False, fragment_loads=True)
print("fragment order:", probe(kern, mem), flush=True)
rng = np.random.default_rng(0)


def frag(t):  # [N, K] -> tiles (nt, kt) of 256 in fragment order
    N, K = t.shape
    return t.reshape(N // 16, 16, K // 16, 16).transpose(0, 2, 1, 3).reshape(N // 16, K // 16, 256)[..., ORDER]


for N, K in [(4096, 2560), (2560, 10240), (20480, 2560)]:
    codes = rng.integers(-127, 128, (N, K), dtype=np.int8)
    scales = (rng.random((N, K // 32)) * 0.02 + 0.001).astype(np.float16)
    sbytes = scales.reshape(-1).view(np.uint8)
    staged = mem.uploaded(np.concatenate([codes.reshape(-1).view(np.uint8), sbytes]), "staged")
    direct = mem.uploaded(np.concatenate([frag(codes).reshape(-1).view(np.uint8), sbytes]), "direct")
    w16 = np.clip(codes.astype(np.float32) * np.repeat(scales.astype(np.float32), 32, axis=1), -65504, 65504).astype(np.float16)
    t16 = mem.uploaded(frag(w16).reshape(-1), "t16")
    chunks = coop_chunks(N, K)
    push = {"N": N, "K": K, "kchunk": K // chunks, "group": 0, "fold_rows": 64}
    for M in (1, 32):
        x = mem.uploaded(rng.standard_normal((M, 2 * K)).astype(np.float16), "x")
        meta = mem.uploaded(np.array([M, M, M, 0, M, 0, 0, 0], np.uint32), "meta")
        out, times = {}, {}
        for name, w, bn in (("coop_i8", staged, 64), ("coop_direct_i8", direct, 128), ("coop_t16", t16, 128),
                            ("coop_direct_i8_ns", direct, 128), ("coop_direct_i8_nd", direct, 128)):
            part = mem.alloc(chunks * 32 * N * 4, "part")
            dset = kern.descriptor_set({0: w, 1: x, 2: part, 4: w, META_BINDING: meta}, part)
            groups = (N // bn) * chunks
            times[name] = best_dispatch_seconds(kern, name, dset, push, groups, 20)
            out[name] = mem.download(part, chunks * 32 * N * 4).view(np.float32).reshape(chunks, 32, N)[:, :M].copy()
            mem.free(part)
        same = [np.array_equal(out["coop_i8"], out[n]) for n in ("coop_direct_i8", "coop_t16")]
        diff = float(np.abs(out["coop_i8"] - out["coop_direct_i8"]).max())
        print(f"N {N} K {K} M {M} chunks {chunks}: staged {1e6 * times['coop_i8']:.1f} us, direct int8 "
              f"{1e6 * times['coop_direct_i8']:.1f} us (no scale loads {1e6 * times['coop_direct_i8_ns']:.1f}, no dequant {1e6 * times['coop_direct_i8_nd']:.1f}), fp16 tiles {1e6 * times['coop_t16']:.1f} us; bits equal to staged: "
              f"direct {same[0]} (max diff {diff:.3g}), fp16 tiles {same[1]}", flush=True)
        mem.free(x); mem.free(meta)
    for b in (staged, direct, t16):
        mem.free(b)
