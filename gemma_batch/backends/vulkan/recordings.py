"""Which recordings of the step a graph makes (`recording_modes`), and which one a step replays
(`recording_for`).

The cooperative path records the step for steps of up to the decode tiles' rows ("small": decode
tiles only) and for longer ones ("prefill": prefill tiles; both for the LM head, whose rows may be
fewer), so that neither replays dispatches of the other's tile without work; with prompt attention
on the matrix units, both again for steps with prompt tokens (suffix FLASH: attention_flash.comp
beside attention.comp); and for decode steps up to the decode tiles' rows, whose attention makes
its heads from qkv's K-chunk sums itself (one dispatch a layer fewer), up to
GATED_PIECES_MAX_TOKENS ("decode") and more ("decode_rows"); other steps without prompt tokens up
to the decode tiles' rows: "small" without the prompt tile ("chunked"). The portable path records
"small" only.
"""

from __future__ import annotations

from collections.abc import Container

# Decode steps of up to GATED_PIECES_MAX_TOKENS tokens (the "decode" recording) run gate/up's
# reduce in pieces of a row (reduce_gated_split); the others a workgroup of 1,024 invocations per
# row (reduce_gated_split_rows). The same bits either way. 4b on the H100, median decode step, pieces
# in decode steps against rows everywhere: batch 1 5.08-5.10 against 5.22-5.23 ms, 8 5.21-5.23
# against 5.28-5.30; rows against pieces: 16 5.52-5.55 against 5.67, 32 6.11-6.14 against
# 6.35-6.39, and in decode steps with heads made in attention 5.74-5.75 against 6.14-6.16 at 32.
GATED_PIECES_MAX_TOKENS = 8
# Decode steps (each token its sequence's only one) up to the decode tiles' rows make their heads
# in attention, its sizes specialised in (the "decode" and "decode_rows" recordings); the same bits
# either way (tests/test_vulkan_attention.py, tests/test_vulkan_coopmat.py), so the choice may
# follow the batch. 4b on the H100, median step: 5.33-5.35 against 5.42-5.44 ms at batch 1 before
# the specialisation; with it, 5.07-5.15 against 5.34-5.35 at 16 and 5.74-5.75 against 5.91-5.93 at
# 32 (docs/EXPERIMENTS.md, "Code size"). On the H200 (bf16, 2026-11-30) above 32 too: decode tok/s
# at batch 48 / 96 / 128 7,810-7,821 / 12,380-12,382 / 13,404-13,413 against 7,608-7,627 /
# 12,052-12,083 / 13,056-13,078 ("Heads made in attention at every decode step").
DECODE_MODES = ("decode", "decode_rows")  # up to GATED_PIECES_MAX_TOKENS tokens, and more
# Other steps without prompt tokens, up to the decode tiles' rows ("chunked"): "small" without the
# prompt tile's dispatches, which such steps give no workgroups (8 a layer: 272 at 4b). 4b bf16
# on the H200, decode at batch 64 / 128: 9,407-9,439 / 12,599-12,621 tok/s against 8,917-8,982 /
# 12,158-12,216 on "small" (docs/EXPERIMENTS.md, "The decode tiles up to 128 rows").
CHUNKED = "chunked"
PROMPTLESS_MODES = (*DECODE_MODES, CHUNKED)  # recordings without the prompt tile
FLASH = "+flash"  # suffix of the recordings of steps with prompt tokens on attention_flash.comp


def recording_modes(coop: bool, flash: bool, heads_in_attention: bool) -> tuple[str, ...]:
    """The recordings to make: on the cooperative path (`coop`) or not, with prompt tokens on the
    flash kernel (`flash`), and whether some layer may make its heads in attention."""
    modes = ("small", "prefill", CHUNKED) if coop else ("small",)
    if flash:
        modes += tuple(f"{mode}{FLASH}" for mode in modes)
    return modes + (DECODE_MODES if heads_in_attention else ())


def recording_for(num_tokens: int, num_seqs: int, prompt: bool, recorded: Container[str], decode_rows: int) -> str:
    """The recording a step of `num_tokens` tokens of `num_seqs` sequences replays, with prompt
    tokens (`prompt`: on the flash kernel where its recordings were made; never in the decode
    recordings, which have no prompt tile) or none, among the `recorded` ones; "small" up to
    `decode_rows` tokens (the decode tiles', coop_tiles.coop_decode_rows)."""
    mode = "small"
    if num_tokens > decode_rows and "prefill" in recorded:
        mode = "prefill"
    elif num_tokens == num_seqs and "decode" in recorded and not prompt:
        mode = "decode" if num_tokens <= GATED_PIECES_MAX_TOKENS else "decode_rows"
    elif not prompt and CHUNKED in recorded:
        mode = CHUNKED
    return mode + FLASH if prompt and mode + FLASH in recorded else mode
