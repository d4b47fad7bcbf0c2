"""Prefill attention's GPU time at 4b, 32 x 512 and 32 x 128 tokens in one step, by build of BLOCK
(shipped: 16 tokens a workgroup, RQ 4, VKB 4; qb8: 8 tokens, grids' block_tokens set to match;
rq2: 2 tokens a value round; vkb8: 8 keys' V loads at once; SPIR-V in .exp/pa), with the hash of
the step's logits (none of these sets a sum, so every build must give the same)."""
import hashlib
import sys
import time
from pathlib import Path
sys.path.insert(0, "benchmarks/results/2026-11-24-h100-attention/experiments")
from common import SHIPPED, swap  # noqa: E402
from gemma_batch.backends.vulkan import VulkanBackend, grids, kernels as Kmod  # noqa: E402
from gemma_batch.bench.random_weights import random_tensors  # noqa: E402
from gemma_batch.bench.runner import prefilled_engine  # noqa: E402
from gemma_batch.bench.shapes import shape_config  # noqa: E402

HERE, NAME = Path(".exp/pa"), "attention_float16_block"
cfg = shape_config("4b")
backend = VulkanBackend(cfg, profile=True)
backend.load_weights(random_tensors(cfg, 0))


def prefill(plen: int) -> tuple[dict[str, float], str]:
    prefilled_engine(backend, 32, plen, 2)
    logits = backend.mem.download(backend.buffers.logits, 4 * 32 * cfg.vocab_size).tobytes()
    return backend.profile_seconds(), hashlib.sha1(logits).hexdigest()[:12]


for plen in (512, 128):
    for label, qb, spv in [("shipped", 16, None), ("qb8", 8, "block_qb8.spv"), ("rq2", 16, "block_rq2.spv"),
                           ("vkb8", 16, "block_vkb8.spv"), ("shipped", 16, None)]:
        Kmod.VARIANTS[NAME] = SHIPPED[NAME]
        backend.kernels.pipelines.pop(NAME, None)
        if spv:
            swap(backend, NAME, HERE / spv)
        grids.block_tokens = lambda kv_group, qb=qb: qb
        backend._drop_graph()
        start = time.time()
        while time.time() - start < 1.5:
            prefill(plen)
        for _ in range(2):
            prof, digest = prefill(plen)
            attn = ", ".join(f"{k} {v * 1e3:.2f}" for k, v in prof.items() if k.startswith("attention"))
            print(f"32x{plen} {label}: prefill GPU {sum(prof.values()) * 1e3:.1f} ms, logits {digest}; {attn}", flush=True)
