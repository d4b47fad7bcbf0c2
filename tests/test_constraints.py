"""Constrained completions on the demo model (CPU backend): every completion matches its regex
or schema, greedy equals a reference that does not use llguidance, and rows stay batch-invariant.

The reference mask is built from the `regex` module's partial matching: token t may follow text s
when some string starting with s + bytes(t) matches the pattern; a stop token when s matches whole.
"""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
import regex

from gemma_batch.engine.constraints import Constraint, Grammars, check_grammar
from gemma_batch.engine.request import Request
from gemma_batch.engine.sampling_params import SamplingParams
from gemma_batch.engine.score import token_logits
from gemma_batch.model.tokenizer import Tokenizer
from tests.demo_engine import demo_cpu, run_engine

STOP = frozenset({Tokenizer.EOS_ID, Tokenizer.END_OF_TURN_ID})
PROMPTS = ["And the LORD said unto Moses,", "In the beginning", "The number of the children of Israel was"]


@pytest.fixture(scope="module")
def model():
    backend, tokenizer = demo_cpu()
    return backend, tokenizer, Grammars(tokenizer, backend.cfg.vocab_size, STOP)


def random_regex(rng: np.random.Generator) -> str:
    """An ASCII pattern of 1-3 parts: words in alternation, classes with counts, optional parts."""
    words = ["yes", "no", "maybe", "the", "LORD", "Moses", "and", "42"]
    parts = []
    for _ in range(int(rng.integers(1, 4))):
        kind = int(rng.integers(4))
        if kind == 0:
            parts.append("(" + "|".join(rng.choice(words, int(rng.integers(2, 4)), replace=False)) + ")")
        elif kind == 1:
            lo = int(rng.integers(1, 3))
            parts.append(f"[{rng.choice(['a-z', '0-9', 'A-Za-z'])}]{{{lo},{lo + int(rng.integers(0, 4))}}}")
        elif kind == 2:
            parts.append(f"( {rng.choice(words)})?")
        else:
            parts.append(rng.choice([" ", ", ", "-"]))
    return "".join(parts)


def complete(backend, tokenizer, requests: list[Request], max_batch: int = 8, budget: int = 512) -> dict:
    return run_engine(backend, tokenizer, requests, max_batch, budget)[0]


def request(grammars, tokenizer, i: int, prompt: str, constraint: Constraint, temperature: float, max_tokens: int = 24):
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=50 * (i % 2), seed=7)
    return Request(i, tokenizer.encode(prompt), params, STOP, params.rng_key(f"row-{i}"), max_tokens,
                   grammars.matcher(constraint))


def test_every_completion_matches_its_random_regex(model):
    backend, tokenizer, grammars = model
    rng = np.random.default_rng(0)
    patterns = [random_regex(rng) for _ in range(24)]
    requests = [request(grammars, tokenizer, i, PROMPTS[i % 3], Constraint("regex", p), [0.0, 1.0, 1.5][i % 3])
                for i, p in enumerate(patterns)]
    done = complete(backend, tokenizer, requests)
    stopped = 0
    for i, p in enumerate(patterns):
        c = done[i]
        if c.finish_reason == "stop":
            stopped += 1
            assert regex.fullmatch(p, c.text), (p, c.text)
        else:  # cut by --max-tokens: still a prefix of a match
            assert c.finish_reason == "length" and len(c.token_ids) == 24
            assert regex.fullmatch(p, c.text, partial=True), (p, c.text)
    assert stopped >= 16


def reference_greedy(backend, tokenizer: Tokenizer, prompt_ids: list[int], pattern: str, max_tokens: int) -> list[int]:
    """Greedy under a mask built with `regex` partial matches, over full forward passes of the CPU
    backend (no llguidance): the most likely allowed token (lowest id on ties) until a stop token,
    the length limit, or a text that nothing but a stop token may follow."""
    vocab = tokenizer.vocab_size
    special = set(tokenizer.added_ids)
    pieces = [tokenizer.piece_bytes(t) for t in range(vocab)]
    compiled = regex.compile(pattern.encode())
    out: list[int] = []
    text = b""
    while len(out) < max_tokens:
        logits = token_logits(backend, [prompt_ids + out + [0]])[0][-1][:vocab]
        allowed = [t for t in range(vocab) if t not in special and pieces[t]
                   and compiled.fullmatch(text + pieces[t], partial=True)]
        if compiled.fullmatch(text):
            if not allowed:
                return out  # the grammar is done: the completion ends without a stop token
            allowed += sorted(STOP)
        best = max(allowed, key=lambda t: (logits[t], -t))
        out.append(best)
        if best in STOP:
            return out
        text += pieces[best]
    return out


# Character classes only: where a grammar forces its next bytes ("yes" after "y"), llguidance allows
# only their canonical first token ("es", not "e"), as vLLM with llguidance does; the reference does
# not model that rule, and a pattern of classes never forces a byte.
@pytest.mark.parametrize("pattern", ["[0-9]{2,4}", "[a-z]{1,6}", "[A-Za-z ]{3,9}", "[0-9a-f]{4}[g-z]{0,3}"])
def test_constrained_greedy_equals_a_reference_without_llguidance(model, pattern):
    backend, tokenizer, grammars = model
    for i, prompt in enumerate(PROMPTS):
        r = request(grammars, tokenizer, i, prompt, Constraint("regex", pattern), 0.0, 10)
        got = complete(backend, tokenizer, [r])[i]
        assert got.token_ids == reference_greedy(backend, tokenizer, r.prompt_ids, pattern, 10)


def random_schema(rng: np.random.Generator) -> dict:
    """An object schema of 1-3 required fields: integers with bounds, booleans, enums, short strings."""
    fields = {}
    for name in rng.choice(["name", "age", "ok", "tribe", "count"], int(rng.integers(1, 4)), replace=False):
        fields[str(name)] = [
            {"type": "integer", "minimum": 0, "maximum": 99},
            {"type": "boolean"},
            {"enum": ["Judah", "Levi", "Dan"]},
            {"type": "string", "maxLength": 6},
        ][int(rng.integers(4))]
    return {"type": "object", "properties": fields, "required": sorted(fields), "additionalProperties": False}


def test_every_completion_is_valid_under_its_random_schema(model):
    backend, tokenizer, grammars = model
    rng = np.random.default_rng(1)
    schemas = [random_schema(rng) for _ in range(12)]
    requests = [request(grammars, tokenizer, i, PROMPTS[i % 3], Constraint.json_schema(s), [0.0, 1.0][i % 2], 64)
                for i, s in enumerate(schemas)]
    done = complete(backend, tokenizer, requests)
    for i, schema in enumerate(schemas):
        assert done[i].finish_reason == "stop", done[i].text
        jsonschema.validate(json.loads(done[i].text), schema)
    any_object = complete(backend, tokenizer, [request(grammars, tokenizer, 0, PROMPTS[0], Constraint("json"), 0.0, 64)])[0]
    assert any_object.text.startswith("{")


def test_constrained_rows_are_identical_alone_together_and_shuffled(model):
    backend, tokenizer, grammars = model
    rng = np.random.default_rng(2)
    constraints = [Constraint("regex", random_regex(rng)) for _ in range(6)] + [
        Constraint.json_schema(random_schema(rng)) for _ in range(4)]

    def requests():  # matchers hold state: fresh ones for every run
        return [request(grammars, tokenizer, i, PROMPTS[i % 3], c, [0.0, 1.0][i % 2], 32) for i, c in enumerate(constraints)]

    alone = {r.request_id: complete(backend, tokenizer, [r], 1)[r.request_id].token_ids for r in requests()}
    together = {k: c.token_ids for k, c in complete(backend, tokenizer, requests(), 16).items()}
    shuffled = [requests()[i] for i in rng.permutation(len(constraints))]
    squeezed = {k: c.token_ids for k, c in complete(backend, tokenizer, shuffled, 3, 24).items()}
    assert together == alone and squeezed == alone


def test_grammars_that_do_not_compile_name_the_problem(model):
    _, _, grammars = model
    with pytest.raises(ValueError, match=r"regex '\(\(' does not compile: .*unclosed group"):
        grammars.matcher(Constraint("regex", "(("))
    with pytest.raises(ValueError, match="JSON schema does not compile: .*objekt"):
        check_grammar(Constraint.json_schema({"type": "objekt"}))
    with pytest.raises(ValueError, match="not valid JSON"):
        Constraint.json_schema("{nope")
    with pytest.raises(ValueError, match="must be a JSON object"):
        Constraint.json_schema([1, 2])


def test_a_mask_never_allows_ids_past_the_tokenizer(model):
    _, tokenizer, _ = model
    wide = Grammars(tokenizer, tokenizer.vocab_size + 70, STOP)  # a padded vocabulary, as 4B+ checkpoints have
    words = np.full(wide.words, -1, np.int32)
    wide.matcher(Constraint("regex", "[a-z ]+")).fill_mask(words)
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")
    assert bits[tokenizer.vocab_size:].sum() == 0
    assert bits[: tokenizer.vocab_size].sum() > 100
    assert not bits[sorted(STOP)].any()  # nothing matched yet: a stop token would end an empty completion


def test_a_stop_id_past_the_tokenizer_is_left_to_the_mask(model):
    """A checkpoint whose EOS id is past the tokenizer's pieces (random-weight shapes): the grammar
    still ends on the tokenizer's EOS."""
    _, tokenizer, _ = model
    past = tokenizer.vocab_size + 60
    grammars = Grammars(tokenizer, tokenizer.vocab_size + 64, frozenset({past, Tokenizer.EOS_ID}))
    matcher = grammars.matcher(Constraint("regex", "no"))
    for token in tokenizer.encode("no", add_bos=False):
        matcher.accept(token)
    words = np.zeros(grammars.words, np.int32)
    matcher.fill_mask(words)
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")
    assert np.flatnonzero(bits).tolist() == [Tokenizer.EOS_ID]
