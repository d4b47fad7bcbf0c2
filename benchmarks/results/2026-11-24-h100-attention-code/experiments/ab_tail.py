"""The step's tail as this tree builds it (the LM head's reduce_rows a vec4 an invocation on a
quarter of the grid; the sampler's greedy pass with 8 vec4 loads in flight) against the commit
before (`before_*.spv`: d6c6c5e's spv/, and reduce_rows' grid of one output an invocation): the
driver's registers and binary size, the logits hashes (must agree), then the median 4b decode step
at batch 1 and 32, the builds alternating, three rounds.

    python3 ab_tail.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-code-size/experiments"))
from builds import alternate_settings, from_files, print_stats  # noqa: E402

from gemma_batch.backends.vulkan import graph  # noqa: E402

HERE = Path(__file__).resolve().parent
NAMES = ("reduce_rows", "sample")
TREE_COLS = graph.ROWS_REDUCE_COLS


def use(before: tuple[str, ...]):
    files = from_files({name: HERE / f"spv/before_{name}.spv" for name in before})

    def setup(backend) -> None:
        files(backend)
        graph.ROWS_REDUCE_COLS = 128 if "reduce_rows" in before else TREE_COLS  # (the recording reads it)
    return setup

if __name__ == "__main__":
    print_stats([(label, name, HERE / f"spv/before_{name}.spv" if label == "before" else None, ())
                 for name in NAMES for label in ("tree", "before")])
    alternate_settings([("tree", use(())), ("rows before", use(("reduce_rows",))),
                        ("both before", use(("reduce_rows", "sample")))])
