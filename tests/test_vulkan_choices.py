"""Scored choices and token log-probabilities on the Vulkan backend: the same answers as the CPU
backend, every label's and token's log-probability within the backends' logits tolerance (fp32 KV,
`test_vulkan_backend.TOL`), and a grammar refused with a clear error (its mask is not in the
sampling shader yet)."""

from __future__ import annotations

import numpy as np
import pytest

from gemma_batch.backends import create_backend
from gemma_batch.engine.choices import Choices
from gemma_batch.engine.constraints import Constraint, Grammars
from gemma_batch.engine.request import Request
from gemma_batch.engine.sampling_params import SamplingParams
from gemma_batch.job.spec import DEMO_MODEL
from gemma_batch.model.checkpoint import Checkpoint
from gemma_batch.model.config import Gemma3Config
from tests.demo_engine import demo_cpu, run_engine

TOL = 1e-3  # log-probabilities: a float64 log-softmax of logits within test_vulkan_backend's fp32 TOL (1e-4) of the CPU's
LABELS = [" Moses", " Aaron", " the children of Israel", " Pharaoh king of Egypt"]
PROMPTS = ["And the LORD spake unto", "Then said", "And it came to pass that", "These are the words which"]


@pytest.fixture(scope="module")
def backends():
    cpu, tokenizer = demo_cpu()
    cfg = Gemma3Config.from_dir(DEMO_MODEL)
    vulkan = create_backend("vulkan", cfg, kv_dtype="fp32")
    vulkan.load_weights(Checkpoint.open(DEMO_MODEL, cfg).tensors())
    return cpu, vulkan, tokenizer


def requests(tokenizer, temperature: float, logprobs: int | None, choices: Choices | None) -> list[Request]:
    params = SamplingParams(max_tokens=6, temperature=temperature, seed=3, logprobs=logprobs)
    return [Request(i, tokenizer.encode(p), params, frozenset({1}), params.rng_key(f"r{i}"), 6, None, choices)
            for i, p in enumerate(PROMPTS)]


def test_choices_on_vulkan_equal_the_cpu(backends):
    cpu, vulkan, tokenizer = backends
    choices = Choices.encode(LABELS, tokenizer)
    ref, _ = run_engine(cpu, tokenizer, requests(tokenizer, 0.0, None, choices))
    got, _ = run_engine(vulkan, tokenizer, requests(tokenizer, 0.0, None, choices))
    for i in ref:
        assert got[i].text == ref[i].text
        ours, theirs = ([c["logprob"] for c in x[i].choice_logprobs] for x in (got, ref))
        assert np.abs(np.array(ours) - theirs).max() < TOL


def test_token_logprobs_on_vulkan_equal_the_cpu(backends):
    cpu, vulkan, tokenizer = backends
    ref, _ = run_engine(cpu, tokenizer, requests(tokenizer, 0.0, 3, None))
    got, _ = run_engine(vulkan, tokenizer, requests(tokenizer, 0.0, 3, None))
    for i in ref:
        assert got[i].token_ids == ref[i].token_ids
        for ours, theirs in zip(got[i].logprobs, ref[i].logprobs):
            assert abs(ours["logprob"] - theirs["logprob"]) < TOL
            assert [a["token_id"] for a in ours["top_logprobs"]][:1] == [a["token_id"] for a in theirs["top_logprobs"]][:1]


def test_a_grammar_mask_is_refused_on_vulkan(backends):
    _, vulkan, tokenizer = backends
    grammars = Grammars(tokenizer, vulkan.cfg.vocab_size, frozenset({1}))
    params = SamplingParams(max_tokens=4)
    request = Request(0, tokenizer.encode("Then said"), params, frozenset({1}), (0, 0), 4,
                      grammars.matcher(Constraint("regex", "(yes|no)")))
    with pytest.raises(ValueError, match="does not apply a grammar's mask"):
        run_engine(vulkan, tokenizer, [request])
    assert not vulkan.constrains
