"""Sampling: the counter-based generator, the filters against transformers' warpers, the draws."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from gemma_batch.backends.base import SamplingBatch
from gemma_batch.backends.sampler import candidates, draw, philox4x32, sample_tokens, uniform
from gemma_batch.engine.sampling_params import SamplingParams


def test_philox_matches_the_random123_known_answers():
    # Known-answer vectors of philox4x32_10 from the Random123 distribution (kat_vectors).
    cases = [
        ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
        ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
        (
            [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344],
            [0xA4093822, 0x299F31D0],
            [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
        ),
    ]
    counters = np.array([c for c, _, _ in cases], np.uint32)
    keys = np.array([k for _, k, _ in cases], np.uint32)
    assert philox4x32(counters, keys).tolist() == [out for _, _, out in cases]


def test_uniforms_are_uniform_and_depend_only_on_key_and_counter():
    keys = np.array([[1, 2]] * 20000, np.uint32)
    u = uniform(keys, np.arange(20000, dtype=np.uint32))
    assert 0 <= u.min() and u.max() < 1
    # 20 equal bins of 1000 expected draws each: a chi-square above 50 (19 dof) has p < 1e-4.
    counts = np.bincount((u * 20).astype(int), minlength=20)
    assert ((counts - 1000) ** 2 / 1000).sum() < 50
    alone = uniform(keys[7:8], np.array([7], np.uint32))
    assert alone[0] == u[7]
    assert uniform(np.array([[1, 3]], np.uint32), np.array([7], np.uint32))[0] != u[7]


def hf_distribution(logits: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """transformers' warpers in generate's order: temperature, top-k, top-p, min-p; then softmax."""
    scores = torch.tensor(logits[None])
    warpers = [TemperatureLogitsWarper(temperature)]
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1:
        warpers.append(TopPLogitsWarper(top_p))
    if min_p:
        warpers.append(MinPLogitsWarper(min_p))
    for warper in warpers:
        scores = warper(None, scores)
    return torch.softmax(scores.double(), dim=-1)[0].numpy()


@pytest.mark.parametrize(
    "temperature,top_k,top_p,min_p",
    [(1.0, 0, 1.0, 0.0), (0.7, 40, 1.0, 0.0), (1.3, 0, 0.9, 0.0), (0.8, 0, 1.0, 0.05), (1.0, 50, 0.8, 0.02)],
)
def test_filters_keep_the_same_tokens_with_the_same_probabilities_as_transformers(temperature, top_k, top_p, min_p):
    rng = np.random.default_rng(0)
    for _ in range(5):
        logits = (rng.standard_normal(1000) * 3).astype(np.float32)
        ids, weights = candidates(logits, temperature, top_k, top_p, min_p)
        ours = np.zeros(len(logits))
        ours[ids] = weights / weights.sum()
        theirs = hf_distribution(logits, temperature, top_k, top_p, min_p)
        assert set(np.flatnonzero(ours)) == set(np.flatnonzero(theirs))
        assert np.abs(ours - theirs).max() < 1e-6  # float32 logits vs float64 softmax


def test_draws_follow_the_filtered_distribution():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
    ids, weights = candidates(logits, 1.0, 0, 1.0, 0.0)
    picks = [draw(ids, weights, u) for u in uniform(np.array([[5, 9]] * 20000, np.uint32), np.arange(20000, dtype=np.uint32))]
    freq = np.bincount(picks, minlength=4) / len(picks)
    assert np.abs(freq - [0.5, 0.3, 0.15, 0.05]).max() < 0.015  # ~4 standard errors at n = 20000


def test_greedy_takes_the_lowest_id_on_ties_and_temperature_zero_is_greedy():
    logits = np.array([[0.0, 2.0, 2.0, 1.0]], np.float32)
    batch = SamplingBatch(
        np.zeros(1, np.float32), np.zeros(1, np.int32), np.ones(1, np.float32), np.zeros(1, np.float32),
        np.zeros((1, 2), np.uint32), np.zeros(1, np.uint32),
    )
    assert sample_tokens(logits, batch, np.array([0])).tolist() == [1]
    assert sample_tokens(logits, None, np.array([0])).tolist() == [1]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_ids_past_the_tokenizer_vocabulary_are_never_drawn(temperature):
    logits = np.array([[0.0, 1.0, 0.5, 9.0, 9.0]], np.float32)  # the padding rows 3, 4 dominate
    batch = SamplingBatch(
        np.full(1, temperature, np.float32), np.zeros(1, np.int32), np.ones(1, np.float32), np.zeros(1, np.float32),
        np.zeros((1, 2), np.uint32), np.zeros(1, np.uint32), vocab_size=3,
    )
    draws = set()
    for counter in range(200):
        batch.counters[0] = counter
        draws.add(int(sample_tokens(logits, batch, np.array([0]))[0]))
    assert draws <= {0, 1, 2} and (temperature == 0 or draws == {0, 1, 2})


def test_row_keys_depend_on_seed_and_row_id_only():
    a, b = SamplingParams(seed=1), SamplingParams(seed=1, temperature=0.5)
    assert a.rng_key("row-7") == b.rng_key("row-7")
    assert a.rng_key("row-7") != a.rng_key("row-8") != SamplingParams(seed=2).rng_key("row-7")


@pytest.mark.parametrize(
    "bad", [dict(max_tokens=0), dict(temperature=-1), dict(top_k=-1), dict(top_p=0), dict(min_p=2), dict(seed=-1), dict(stop=("",))]
)
def test_sampling_params_refuse_out_of_range_values(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)


def sorted_reference(x: np.ndarray, temperature: float, top_p: float, min_p: float) -> tuple[list, np.ndarray]:
    """The rule done the slow way: sort the whole vocabulary, cut the nucleus, then min-p."""
    x = x / np.float32(temperature)
    order = np.lexsort((np.arange(len(x)), -x))
    w = np.exp((x - x.max()).astype(np.float64))
    n = int(np.searchsorted(np.cumsum(w[order]), top_p * w.sum(), side="left")) + 1
    keep = order[:n]
    keep = keep[w[keep] >= min_p * w[keep].max()]
    return keep.tolist(), w[keep]


@pytest.mark.parametrize("scale,levels", [(3.0, None), (0.5, None), (2.0, 4.0)])
def test_top_p_over_a_large_vocabulary_equals_sorting_everything(scale, levels):
    """Vocabularies larger than the first sorted slice, flat ones (the nucleus outgrows the slice)
    and heavily tied ones (ties straddle the slice's edge)."""
    rng = np.random.default_rng(3)
    for top_p, min_p in [(0.9, 0.0), (0.5, 0.0), (0.99, 0.001), (0.999, 0.0)]:
        x = (rng.standard_normal(50_000) * scale).astype(np.float32)
        if levels is not None:
            x = np.round(x * levels) / levels  # few distinct values: thousands of ties
        ids, weights = candidates(x, 1.0, 0, top_p, min_p)
        ref_ids, ref_weights = sorted_reference(x, 1.0, top_p, min_p)
        assert ids.tolist() == ref_ids and np.array_equal(weights, ref_weights)
