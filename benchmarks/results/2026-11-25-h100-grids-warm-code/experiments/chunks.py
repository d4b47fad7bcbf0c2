"""The 4b decode step with the matmuls' K chunks cut for fuller grids: chunk counts that need not
divide K's stages (common.glsl CHUNK_K), so that a matrix's workgroups can come close to the 528
of a first wave (4 an SM on 132 SMs) instead of 160-320. One backend; each rule in turn (the
shipped rule first), recorded again, 1 s of warm-up, median step at batch 1 and 32; two rounds.
Before the timings: each rule's logits over 6 decode steps at batch 1 against the shipped rule's
(largest difference over the largest logit; the sums' order changes, so they differ in rounding).
usage: chunks.py"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-attention" / "experiments"))
from common import backend_4b, decode_logits, settings_in_turn  # noqa: E402
from gemma_batch.backends.vulkan import coop_tiles, graph, step_buffers  # noqa: E402

SHIPPED = coop_tiles.coop_chunks
# K chunks of qkv / o / gate-up / down (4b: 32, 20, 160 and 20 column tiles of 128)
RULES = {"shipped": None, "gate-up 3": (8, 8, 3, 16), "down 26": (8, 8, 2, 26), "gate-up 3, down 26": (8, 8, 3, 26),
         "qkv 16, gate-up 3, down 26": (16, 8, 3, 26), "all near 528": (16, 26, 3, 26), "down 24": (8, 8, 3, 24)}
RULE = {"now": None}
SHAPES = {(4096, 2560): 0, (2560, 2048): 1, (20480, 2560): 2, (2560, 10240): 3}  # (outputs, K): place in a rule


def chunks(N: int, K: int, min_chunk: int = coop_tiles.COOP_MIN_CHUNK) -> int:
    rule = RULE["now"]
    if rule is None or (N, K) not in SHAPES:
        return SHIPPED(N, K, min_chunk)
    return rule[SHAPES[(N, K)]]


coop_tiles.coop_chunks = graph.coop_chunks = step_buffers.coop_chunks = chunks


def main() -> None:
    backend = backend_4b()
    ref = None
    for label, rule in RULES.items():
        RULE["now"] = rule
        backend._drop_graph()
        got = np.concatenate(decode_logits(backend, 1))  # 6 steps' rows
        ref = got if ref is None else ref
        err = np.abs(got - ref).max() / np.abs(ref).max()
        print(f"{label}: logits against the shipped rule's, largest difference {err:.2e} of the largest; "
              f"argmax equal {np.array_equal(got.argmax(1), ref.argmax(1))}", flush=True)
    settings_in_turn(backend, [(f"{label} {rule or ''}", rule) for label, rule in RULES.items()],
                     lambda rule: RULE.update(now=rule))


if __name__ == "__main__":
    main()
