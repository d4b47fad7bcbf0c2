"""Each token's logits by (sequence, position), kept by a step hook, for tests that run the same
prompts two ways and compare the bits."""

from __future__ import annotations

import numpy as np


def keep_logits(rows: dict, ids, batch, result) -> None:
    """Into `rows`, the logits of every token of the step (`ids`, `batch`, `result` as an
    `on_step` hook gets them), by (prompt index, position)."""
    for s, seq in enumerate(ids):
        for t in range(batch.seq_starts[s], batch.seq_starts[s + 1]):
            rows[(seq, int(batch.positions[t]))] = result.logits[t].copy()


def assert_same_logits(ours: dict, ref: dict, label: object = "") -> None:
    """The same tokens, and every token's logits bit for bit."""
    assert ours.keys() == ref.keys(), label
    for key in ref:
        assert np.array_equal(ours[key], ref[key]), (label, key)
