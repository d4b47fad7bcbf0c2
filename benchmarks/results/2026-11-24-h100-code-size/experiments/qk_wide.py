"""Decode steps of 9 to 32 tokens in the "decode" recording too (graph.QK_IN_MAX_TOKENS 32: attention
makes its heads, now specialised, instead of reduce_qk_rope), with gate/up's reduce a workgroup per
row (GATED_PIECES_MODES empty) or in pieces, against the shipped recordings: logits hashes (must
agree), median 4b decode step at batch 16 and 32, alternating, three rounds.

    python3 qk_wide.py

Run at `fdff182`: graph.GATED_PIECES_MODES, which it sets, went in the review after `d91c5f8`
(the "decode" recording is the one with pieces)."""
from builds import alternate_settings
from gemma_batch.backends.vulkan import graph


def setting(qk_max: int, pieces: tuple[str, ...]):
    def setup(backend) -> None:
        graph.QK_IN_MAX_TOKENS, graph.GATED_PIECES_MODES = qk_max, pieces
    return setup


if __name__ == "__main__":
    shipped = setting(graph.QK_IN_MAX_TOKENS, graph.GATED_PIECES_MODES)
    alternate_settings([("shipped", shipped), ("qk to 32, rows", setting(32, ())),
                        ("qk to 32, pieces", setting(32, ("decode",)))], batches=(16, 32))
