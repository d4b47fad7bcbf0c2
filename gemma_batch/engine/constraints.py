"""Constrained completions: what a completion must match, and the tokens each step allows.

A `Constraint` is what a user asks for (`--regex`, `--json-schema`, `--json`, or the same per
row); llguidance (MIT, no dependencies) turns it into a grammar and, token by token, into the set
of tokens that keep the completion inside it. That set is a bitmask of int32 words, bit j of word
w allowing token 32 w + j (`backends.sampler` applies it before anything else), over the model's
padded vocabulary: ids past the tokenizer's are always off.

    grammars = Grammars(tokenizer, vocab_size)
    matcher = grammars.matcher(Constraint("regex", "(yes|no)"))   # ValueError: bad pattern
    matcher.fill_mask(words)       # the tokens allowed next
    matcher.accept(token)          # after the draw
    matcher.done                   # the grammar can take nothing more: the completion ends
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from llguidance import LLMatcher, LLTokenizer, TokenizerWrapper

from ..model.tokenizer import Tokenizer

KINDS = ("regex", "json_schema", "json")
# JSON as json.dumps writes it: one space after "," and ":", none elsewhere (whitespace left free
# lets a model pad forever); a schema's "x-guidance" options override it.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Constraint:
    """What a completion must match: a regex (whole completion), a JSON schema (JSON text), or
    `json` (any JSON object; `spec` empty)."""

    kind: str
    spec: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"constraint kind {self.kind!r}: expected one of {', '.join(KINDS)}")

    @classmethod
    def json_schema(cls, schema: Any) -> Constraint:
        """From a schema given as a JSON object (dict) or its text; ValueError if it is neither."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"JSON schema is not valid JSON: {e}") from e
        if not isinstance(schema, dict):
            raise ValueError(f"a JSON schema must be a JSON object, got {type(schema).__name__}")
        return cls("json_schema", json.dumps(schema, separators=(",", ":")))  # (property order kept: it is the output's)

    def grammar(self) -> str:
        """The llguidance grammar (checked by `Grammars.matcher`)."""
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.spec)
        schema = json.loads(self.spec) if self.kind == "json_schema" else {"type": "object"}
        return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)

    def describe(self) -> str:
        """How errors name it: `regex '(a|b'`, `JSON schema`, `JSON`."""
        return {"regex": f"regex {self.spec!r}", "json_schema": "JSON schema", "json": "JSON"}[self.kind]


def check_grammar(constraint: Constraint) -> str:
    """The constraint's llguidance grammar; ValueError naming it if it does not compile (checked
    without a tokenizer: `Grammars.matcher` checks again with one)."""
    try:
        grammar = constraint.grammar()
    except ValueError as e:
        raise ValueError(f"{constraint.describe()}: {e}") from e
    problem = LLMatcher.validate_grammar(grammar)
    if problem and not problem.startswith("WARNING"):
        raise ValueError(f"{constraint.describe()} does not compile: {_one_line(problem)}")
    return grammar


def _one_line(problem: str) -> str:
    """llguidance's error on one line: its first line and its `error:` lines (not the source
    excerpts and carets between them)."""
    lines = [line.strip() for line in problem.strip().splitlines()]
    return " ".join([lines[0], *(line for line in lines[1:] if line.startswith("error:"))])


def step_masks(matchers: list[Matcher | None], sample: np.ndarray, vocab_size: int) -> np.ndarray | None:
    """A step's `SamplingBatch.allowed`: the mask of each sampled sequence with a matcher, -1 words
    (all allowed) for the others; None when no sequence has one."""
    if all(m is None for m in matchers):
        return None
    allowed = np.full((len(matchers), -(-vocab_size // 32)), -1, np.int32)
    for s, matcher in enumerate(matchers):
        if matcher is not None and sample[s]:
            matcher.fill_mask(allowed[s])
    return allowed


class _TokenBytes:
    """What llguidance's TokenizerWrapper reads: each id's bytes, the special ids, and an encoder."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.eos_token_id = Tokenizer.EOS_ID
        self.bos_token_id = Tokenizer.BOS_ID
        self.tokens = [tokenizer.piece_bytes(i) for i in range(tokenizer.vocab_size)]
        self.special_token_ids = tokenizer.added_ids
        self._tokenizer = tokenizer

    def __call__(self, text: bytes | str) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return self._tokenizer.encode(text, add_bos=False)


class _OnThread:
    """A value made on a daemon thread from the start, waited for where it is first needed."""

    def __init__(self, make: Callable[[], Any], name: str) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(make,), name=name, daemon=True)
        self._thread.start()

    def _run(self, make: Callable[[], Any]) -> None:
        try:
            self._value = make()
        except BaseException as e:  # noqa: BLE001 - raised again in get()
            self._error = e

    def get(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


class Grammars:
    """llguidance's view of one tokenizer, and the matchers of constraints over it.

    The view takes about 10 ms to build at 4k pieces but 0.8 s at the real models' 262k (its token
    trie and slices, in Rust, which lets go of the GIL): it is built on a thread from construction,
    so a job that makes its Grammars before loading its weights has it by its first row."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_ids: frozenset[int]) -> None:
        """`vocab_size`: the model's (mask width); `stop_ids`: the tokens that may end a completion
        the grammar accepts (those past the tokenizer's ids, which no mask allows, left out; the
        tokenizer's EOS always in)."""
        self.vocab_size = vocab_size
        self.words = -(-vocab_size // 32)
        self._tokenizer_vocab = tokenizer.vocab_size
        stops = sorted({Tokenizer.EOS_ID, *(i for i in stop_ids if i < tokenizer.vocab_size)})
        self._lltokenizer = _OnThread(lambda: LLTokenizer(TokenizerWrapper(_TokenBytes(tokenizer)), eos_token=stops),
                                      "llguidance-tokenizer")
        self._grammars: dict[Constraint, str] = {}  # checked once: a job's constraint serves every row

    def matcher(self, constraint: Constraint) -> Matcher:
        """A fresh matcher; ValueError naming the constraint if its grammar does not compile."""
        grammar = self._grammars.get(constraint)
        if grammar is None:
            grammar = self._grammars[constraint] = check_grammar(constraint)
        matcher = LLMatcher(self._lltokenizer.get(), grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"{constraint.describe()} does not compile: {_one_line(matcher.get_error())}")
        return Matcher(matcher, self.words, self._tokenizer_vocab)


class Matcher:
    """One completion's place in its grammar."""

    def __init__(self, matcher: LLMatcher, words: int, tokenizer_vocab: int) -> None:
        self._matcher = matcher
        self._words = words
        self._tokenizer_vocab = tokenizer_vocab

    def fill_mask(self, out: np.ndarray) -> None:
        """Write the tokens allowed next into `out` [words] int32 (ids past the tokenizer off)."""
        mask = np.frombuffer(self._matcher.compute_bitmask(), np.int32)
        n = min(len(mask), self._words)
        out[:n] = mask[:n]
        out[n:] = 0
        word, bit = divmod(self._tokenizer_vocab, 32)
        if word < self._words:
            out[word] &= np.int32((1 << bit) - 1) if bit else 0
            out[word + 1:] = 0

    def accept(self, token: int) -> None:
        """Advance past a drawn token; ValueError if the grammar does not allow it."""
        if not self._matcher.consume_token(token):
            raise ValueError(f"token {token} is outside the grammar: {self._matcher.get_error()}")

    @property
    def done(self) -> bool:
        """The grammar takes nothing more (it may still take a stop token, which adds no text)."""
        return self._matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        """The completion so far is a whole match."""
        return self._matcher.is_accepting()
