"""Does a decode-step kernel cost less when its code and data are warm? Timing only (the results are
wrong on purpose): the shipped 4b decode recording with one kind of kernel recorded twice in a row
(a barrier after each), so that the second runs right after itself; and with a copy of the layer's
attention recorded beside the layer's down matmul (no barrier between the two), so that SMs have
run attention's code shortly before the next layer's attention. Settings alternate, two rounds,
1 s of warm-up each, median step at batch 1 and 32.
usage: twice.py"""
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-attention" / "experiments"))
from common import backend_4b, settings_in_turn  # noqa: E402
from gemma_batch.backends.vulkan import graph as G  # noqa: E402
from gemma_batch.backends.vulkan import kernels as Kmod  # noqa: E402

SETTINGS = [("whole", None, False), ("attention twice", r"^attention", False),
            ("post-norm reduces twice", r"^reduce_post_norm_split", False), ("gated reduces twice", r"^reduce_gated_split", False),
            ("decode matmuls twice", r"^coop_t16$", False), ("attention beside down", None, True)]
MODE = {"twice": None, "beside": False, "skip_barrier": False}
orig_dispatch, orig_barrier = G.StepGraph._dispatch, Kmod.Kernels._barrier


def dispatch(self, name, buffers, push, grid, specialize=False):
    decode = self.mode.startswith("decode")
    if decode and name.startswith("attention"):
        self.last_attention = (name, buffers, push, grid, specialize)
    down = name == "coop_t16" and push["K"] == self.cfg.intermediate_size
    if decode and MODE["beside"] and down and getattr(self, "last_attention", None):
        MODE["skip_barrier"] = True  # down and the attention copy overlap; a barrier after both
        orig_dispatch(self, name, buffers, push, grid, specialize)
        orig_dispatch(self, *self.last_attention)
        return
    orig_dispatch(self, name, buffers, push, grid, specialize)
    if decode and MODE["twice"] and re.search(MODE["twice"], name):
        orig_dispatch(self, name, buffers, push, grid, specialize)


def barrier(self, cb, *args, **kwargs):
    if MODE["skip_barrier"] and not args and not kwargs:
        MODE["skip_barrier"] = False
        return
    orig_barrier(self, cb, *args, **kwargs)


G.StepGraph._dispatch, Kmod.Kernels._barrier = dispatch, barrier


def main() -> None:
    settings_in_turn(backend_4b(), [(label, (twice, beside)) for label, twice, beside in SETTINGS],
                     lambda setting: MODE.update(twice=setting[0], beside=setting[1]))


if __name__ == "__main__":
    main()
