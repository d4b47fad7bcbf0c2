"""Scored choices on the demo model (CPU backend): each label's log-probability equals the sum over
its tokens of a full-vocabulary log-softmax of the CPU backend's logits from full forward passes
(prompt + label, no shared prompt, no rewinds), the answer is their arg-max under greedy, and rows
are batch-invariant even when preemptions make them start over."""

from __future__ import annotations

import numpy as np
import pytest

from gemma_batch.backends.sampler import log_softmax, uniform
from gemma_batch.engine.choices import Choices
from gemma_batch.engine.sampling_params import SamplingParams
from gemma_batch.engine.request import Request
from gemma_batch.engine.score import token_logits
from tests.demo_engine import demo_cpu, run_engine

LABELS = [" Moses", " Aaron", " the children of Israel", " Pharaoh king of Egypt", " Joshua the son of Nun"]
PROMPTS = ["And the LORD spake unto", "Then said", "And it came to pass that", "These are the words which",
           "In the beginning God created the heaven and the earth. And the earth was without form, and void; and"
           " darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And"]


@pytest.fixture(scope="module")
def model():
    return demo_cpu()


def answer(backend, tokenizer, requests: list[Request], max_batch: int = 8, budget: int = 512, seqs: int = 8,
           ahead: int | None = None):
    """Completions by request id, and preemptions; the KV pool holds `seqs` of the longest row."""
    length = max(len(r.prompt_ids) + r.choices.longest for r in requests)
    return run_engine(backend, tokenizer, requests, max_batch, budget, seqs, length, ahead)


def requests(tokenizer, temperature: float = 0.0, labels=LABELS) -> list[Request]:
    choices = Choices.encode(labels, tokenizer)
    params = SamplingParams(temperature=temperature, seed=4)
    return [Request(i, tokenizer.encode(p), params, frozenset({1}), params.rng_key(f"row-{i}"), None, None, choices)
            for i, p in enumerate(PROMPTS)]


def reference_logprobs(backend, tokenizer, prompt: str, labels) -> np.ndarray:
    ids = tokenizer.encode(prompt)
    out = []
    for label in labels:
        tokens = tokenizer.encode(label, add_bos=False)
        lp = log_softmax(token_logits(backend, [ids + tokens])[0][len(ids) - 1:])  # after the prompt, each label token
        out.append(sum(lp[j, t] for j, t in enumerate(tokens)))
    return np.array(out)


def test_label_logprobs_equal_full_forward_passes_and_greedy_takes_the_best(model):
    backend, tokenizer = model
    got, _ = answer(backend, tokenizer, requests(tokenizer))
    for i, prompt in enumerate(PROMPTS):
        ref = reference_logprobs(backend, tokenizer, prompt, LABELS)
        rows = got[i].choice_logprobs
        assert [r["choice"] for r in rows] == LABELS
        np.testing.assert_allclose([r["logprob"] for r in rows], ref, rtol=0, atol=1e-5)
        probs = np.array([r["probability"] for r in rows])
        np.testing.assert_allclose(probs, np.exp(ref - ref.max()) / np.exp(ref - ref.max()).sum(), rtol=0, atol=1e-5)
        assert abs(probs.sum() - 1) < 1e-12
        assert got[i].text == LABELS[int(np.argmax(ref))] and got[i].finish_reason == "stop"
        assert got[i].token_ids == tokenizer.encode(got[i].text, add_bos=False)


def test_sampling_draws_a_label_from_its_probabilities(model):
    backend, tokenizer = model
    got, _ = answer(backend, tokenizer, requests(tokenizer, temperature=1.0))
    for i, r in enumerate(requests(tokenizer, temperature=1.0)):
        probs = np.array([c["probability"] for c in got[i].choice_logprobs])
        u = uniform(np.array([r.rng_key], np.uint32), np.zeros(1, np.uint32))[0]
        assert got[i].text == LABELS[int(np.searchsorted(np.cumsum(probs), u, side="right"))]


def test_choices_are_batch_invariant_with_preemptions(model):
    backend, tokenizer = model
    alone = {r.request_id: answer(backend, tokenizer, [r], 1)[0][r.request_id] for r in requests(tokenizer)}
    for ahead in (0, 2):  # with steps submitted ahead, a sequence whose scores are in flight is not preempted
        shuffled = [requests(tokenizer)[i] for i in (3, 0, 4, 2, 1)]
        squeezed, preemptions = answer(backend, tokenizer, shuffled, 4, 24, 1, ahead)
        assert preemptions > 0
        for i, c in alone.items():
            assert squeezed[i].text == c.text and squeezed[i].choice_logprobs == c.choice_logprobs
        roomy, _ = answer(backend, tokenizer, shuffled, 4, 24, 8, ahead)
        assert {i: c.choice_logprobs for i, c in roomy.items()} == {i: c.choice_logprobs for i, c in alone.items()}


def test_single_token_labels_need_no_step_after_the_prompt(model):
    backend, tokenizer = model
    labels = [w for w in (" the", " and", " of") if len(tokenizer.encode(w, add_bos=False)) == 1]
    assert len(labels) >= 2
    got, _ = answer(backend, tokenizer, requests(tokenizer, labels=labels))
    for i, prompt in enumerate(PROMPTS):
        ref = reference_logprobs(backend, tokenizer, prompt, labels)
        np.testing.assert_allclose([r["logprob"] for r in got[i].choice_logprobs], ref, rtol=0, atol=1e-5)


def test_bad_labels_are_refused(model):
    _, tokenizer = model
    for labels, message in [(["yes"], "2 to"), (["yes", "yes"], "repeated"), (["yes", ""], "non-empty")]:
        with pytest.raises(ValueError, match=message):
            Choices.encode(labels, tokenizer)
