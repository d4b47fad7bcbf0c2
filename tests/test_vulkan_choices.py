"""Scored choices, token log-probabilities and grammars on the Vulkan backend: the same answers as
the CPU backend, every label's and token's log-probability within the backends' logits tolerance
(fp32 KV, `test_vulkan_backend.TOL`), and grammar masks applied by the sampling shader, given while
the step runs."""

from __future__ import annotations

import json
import re
import time

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
from gemma_batch.model.tokenizer import Tokenizer
from gemma_batch.backends.sampler import log_softmax
from tests.demo_engine import demo_cpu, run_engine
from tests.vulkan_dispatch import Dispatches

TOL = 1e-3  # log-probabilities: a float64 log-softmax of logits within test_vulkan_backend's fp32 TOL (1e-4) of the CPU's
LABELS = [" Moses", " Aaron", " the children of Israel", " Pharaoh king of Egypt"]
PROMPTS = ["And the LORD spake unto", "Then said", "And it came to pass that", "These are the words which"]
STOP = frozenset({Tokenizer.EOS_ID, Tokenizer.END_OF_TURN_ID})
SCHEMA = {"type": "object", "properties": {"tribe": {"enum": ["Judah", "Levi", "Dan"]},
                                           "count": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["tribe", "count"], "additionalProperties": False}


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


def test_row_scores_are_the_log_softmax_at_the_pairs():
    """row_scores.comp against a float64 log-softmax of the same logits (ids below the vocabulary
    limit only). Within 2e-5: its values are about 20 in size, so fp32 rounds each of lse and
    x - lse by up to 1e-6, and the fp32 sum of 1,024 invocations' 256 terms each (exp_neg within
    1e-7) is within 256 x 6e-8 = 1.5e-5 relative at worst (about 1e-6 as measured)."""
    rng = np.random.default_rng(23)
    R, V, limit = 6, 262208, 262144
    x = (rng.standard_normal((R, V)) * 3).astype(np.float32)
    x[:, rng.choice(limit, 30)] += 12  # peaked rows, as a model's are
    x[:, limit:] = 60.0  # past the limit: never counted
    rows, counts = [5, 0, 3, 2], [3, 1, 64, 2]
    ids = [rng.choice(limit, n, replace=False) for n in counts]
    firsts = np.cumsum(counts) - counts
    header = np.array([len(rows), *np.stack([rows, firsts, counts], 1).ravel()], np.uint32)
    try:
        d = Dispatches(tokens=1, rows=R)
    except Exception as e:  # no Vulkan driver here
        pytest.skip(f"no Vulkan device: {e}")
    with d:
        d.meta.array[12:16] = np.array([limit], np.uint32).view(np.uint8)  # the header's vocab_limit
        out = d.alloc(4 * sum(counts), "scores")
        d.dispatch("row_scores", {0: d.upload(x, "logits"), 1: d.upload(header, "score rows"),
                                  2: d.upload(np.concatenate(ids).astype(np.uint32), "ids"), 3: out},
                   {"row_stride": V}, groups=R)
        d.run()
        got = d.download(out).view(np.float32)
    want = np.concatenate([log_softmax(x[r, :limit])[i] for r, i in zip(rows, ids)])
    print("row_scores max error", np.abs(got - want).max())
    assert np.abs(got - want).max() < 2e-5


def test_token_logprobs_on_vulkan_equal_the_cpu(backends):
    cpu, vulkan, tokenizer = backends
    ref, _ = run_engine(cpu, tokenizer, requests(tokenizer, 0.0, 3, None))
    got, _ = run_engine(vulkan, tokenizer, requests(tokenizer, 0.0, 3, None))
    for i in ref:
        assert got[i].token_ids == ref[i].token_ids
        for ours, theirs in zip(got[i].logprobs, ref[i].logprobs):
            assert abs(ours["logprob"] - theirs["logprob"]) < TOL
            assert [a["token_id"] for a in ours["top_logprobs"]][:1] == [a["token_id"] for a in theirs["top_logprobs"]][:1]


def constrained(grammars, tokenizer, temperature: float) -> list[Request]:
    """Rows under regexes and JSON schemas (fresh matchers: they hold state)."""
    constraints = [Constraint("regex", "(yes|no|maybe), [a-z]{3,8}"), Constraint("regex", "[0-9]{1,3}( [A-Z][a-z]+)?"),
                   Constraint.json_schema(SCHEMA), Constraint("json")]
    params = SamplingParams(max_tokens=24, temperature=temperature, top_k=40 if temperature else 0, seed=5)
    return [Request(i, tokenizer.encode(PROMPTS[i]), params, STOP, params.rng_key(f"g{i}"), 24, grammars.matcher(c))
            for i, c in enumerate(constraints)]


def valid(completion, i: int) -> bool:
    """Whether row i's completion matches its constraint (`re`, and the schema checked by hand: the
    GPU machine has neither `regex` nor `jsonschema`)."""
    text = completion.text
    if i < 2:
        return re.fullmatch(["(yes|no|maybe), [a-z]{3,8}", "[0-9]{1,3}( [A-Z][a-z]+)?"][i], text) is not None
    try:
        value = json.loads(text)
    except ValueError:
        return completion.finish_reason == "length"  # cut by --max-tokens: a prefix is all there is
    if i == 2:
        return (isinstance(value, dict) and sorted(value) == ["count", "tribe"] and value["tribe"] in ("Judah", "Levi", "Dan")
                and type(value["count"]) is int and 0 <= value["count"] <= 99)
    return isinstance(value, dict)


def test_grammars_on_vulkan_equal_the_cpu_and_hold(backends):
    """Greedy under a grammar: the CPU's tokens (the sampling shader masks as backends.sampler
    does). Sampled: every completion valid, the same alone as in the batch."""
    cpu, vulkan, tokenizer = backends
    grammars = Grammars(tokenizer, vulkan.cfg.vocab_size, STOP)
    ref, _ = run_engine(cpu, tokenizer, constrained(grammars, tokenizer, 0.0))
    got, _ = run_engine(vulkan, tokenizer, constrained(grammars, tokenizer, 0.0))
    assert {i: c.token_ids for i, c in got.items()} == {i: c.token_ids for i, c in ref.items()}
    together, _ = run_engine(vulkan, tokenizer, constrained(grammars, tokenizer, 1.0))
    for i, completion in together.items():
        assert valid(completion, i), (i, completion.text)
    for i in (0, 2):
        alone, _ = run_engine(vulkan, tokenizer, [constrained(grammars, tokenizer, 1.0)[i]], max_batch=1)
        assert alone[i].token_ids == together[i].token_ids


def test_a_step_samples_only_once_its_masks_come(backends, monkeypatch):
    """The engine submits a constrained step, then computes its masks while the device runs it
    (Backend.allow): the step cannot finish before they come."""
    _, vulkan, tokenizer = backends
    grammars = Grammars(tokenizer, vulkan.cfg.vocab_size, STOP)
    vk, given, finished_early = vulkan.device.vk, vulkan.allow, []

    def late_allow(allowed):
        time.sleep(0.2)  # (a demo step takes a few ms)
        fence = vulkan.device.fences[vulkan._in_flight[-1].slot]
        try:
            vk.vkGetFenceStatus(vulkan.device.device, fence)
            finished_early.append(True)
        except vk.VkNotReady:
            finished_early.append(False)
        given(allowed)

    monkeypatch.setattr(vulkan, "allow", late_allow)
    done, _ = run_engine(vulkan, tokenizer, constrained(grammars, tokenizer, 0.0)[:2])
    assert finished_early and not any(finished_early)
    assert all(valid(c, i) for i, c in done.items())
