"""Where the shipped 4b decode step goes now: the median step with kinds of dispatches left out of
the recording (timing only: the results are wrong on purpose), or with no pipeline barrier
between dispatches; then with the K chunks cut for other grid sizes (coop_tiles'
COOP_TARGET_GROUPS and the shortest chunk). Settings alternate, after 1 s of warm-up each.
usage: skip.py [--chunks]"""
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-attention" / "experiments"))
from common import backend_4b, measure, settings_in_turn  # noqa: E402
from gemma_batch.backends.vulkan import coop_tiles  # noqa: E402
from gemma_batch.backends.vulkan import graph as G  # noqa: E402
from gemma_batch.backends.vulkan import kernels as Kmod  # noqa: E402

MODE = {"skip": None, "barriers": True}
REDUCES = r"^reduce_(post_norm_split|gated_split)"  # the three a layer (the last layer's and the LM head's stay)
SETTINGS = [("whole", None, True), ("no reduces", REDUCES, True), ("no attention", r"^attention", True),
            ("no reduces, no attention", REDUCES + r"|^attention", True),
            ("no post-norm reduces", r"^reduce_post_norm_split", True), ("no gated reduces", r"^reduce_gated_split", True),
            ("no matmuls", r"^coop_(t16|gated_t16)$", True), ("no barriers", None, False)]

orig_dispatch, orig_barrier = G.StepGraph._dispatch, Kmod.Kernels._barrier


def dispatch(self, name, buffers, push, grid, specialize=False):
    if MODE["skip"] and self.mode.startswith("decode") and re.search(MODE["skip"], name):
        return
    orig_dispatch(self, name, buffers, push, grid, specialize)


def barrier(self, cb, *args, **kwargs):  # the barrier after each dispatch takes no arguments; begin/end_step's do
    if MODE["barriers"] or args or kwargs:
        orig_barrier(self, cb, *args, **kwargs)


G.StepGraph._dispatch, Kmod.Kernels._barrier = dispatch, barrier


def main() -> None:
    if "--chunks" in sys.argv:  # (target workgroups, shortest chunk): the shipped rule first
        for target, min_chunk in [(512, 256), (1024, 128), (1024, 256), (256, 256), (512, 256)]:
            coop_tiles.COOP_TARGET_GROUPS = target  # read by coop_chunks at each call
            backend = backend_4b(coop_min_chunk=min_chunk)
            cfg = backend.cfg
            qkv = cfg.q_width + 2 * cfg.kv_width
            chunks = [coop_tiles.coop_chunks(n, k, min_chunk) for n, k in
                      [(qkv, cfg.hidden_size), (cfg.hidden_size, cfg.q_width),
                       (2 * cfg.intermediate_size, cfg.hidden_size), (cfg.hidden_size, cfg.intermediate_size)]]
            measure(backend, f"target {target}, shortest {min_chunk}: chunks qkv/o/gate-up/down {chunks}")
            backend.close()
        return
    settings_in_turn(backend_4b(), [(label, (skip, barriers)) for label, skip, barriers in SETTINGS],
                     lambda setting: MODE.update(skip=setting[0], barriers=setting[1]))


if __name__ == "__main__":
    main()
