"""Tokenizer, chat template and streaming detokenizer, checked against transformers.

The reference is transformers' own `AutoTokenizer` loaded from the same folder (it converts
`tokenizer.model` to a `tokenizers` BPE independently of this code) with Google's chat template.
Everything is exact: ids and strings must be equal, no tolerance.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from gemma_batch.model.chat import chat_token_ids, render_chat
from gemma_batch.model.detokenizer import IncrementalDetokenizer
from gemma_batch.model.tokenizer import AddedPieces, Tokenizer
from gemma_batch.model.tokenizer_build import CHAT_TEMPLATE_FILE, build_gemma_tokenizer

VOCAB_SIZE = 1000
_CORPUS_MODULES = ("json", "re", "collections", "pathlib", "textwrap", "string", "functools",
                   "itertools", "argparse", "dataclasses", "inspect", "os", "io")


@functools.cache
def ascii_corpus() -> tuple[str, ...]:
    """Stdlib docstrings, ASCII only, so every non-ASCII character below needs byte fallback."""
    texts = []
    for name in _CORPUS_MODULES:
        module = importlib.import_module(name)
        for obj in [module, *(getattr(module, a, None) for a in sorted(dir(module)))]:
            doc = getattr(obj, "__doc__", None)
            if isinstance(doc, str) and doc.isascii():
                texts.append(doc)
    # A few lines with tabs and digits, so that "\t" and every digit have a piece of their own.
    texts += [f"row\t{i}\tvalue {i * 37 % 1000}\n" for i in range(200)]
    return tuple(texts)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gemma_tok")
    build_gemma_tokenizer(ascii_corpus(), VOCAB_SIZE, out)
    return out


@pytest.fixture(scope="module")
def tok(tok_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tok_dir)


@pytest.fixture(scope="module")
def hf(tok_dir: Path):
    return AutoTokenizer.from_pretrained(tok_dir)


# ----------------------------------------------------------------------------- build and load


def test_build_is_deterministic_and_hf_loads_it_as_gemma(tok_dir: Path, tmp_path: Path, hf) -> None:
    again = build_gemma_tokenizer(ascii_corpus(), VOCAB_SIZE, tmp_path)
    assert again.read_bytes() == (tok_dir / "tokenizer.model").read_bytes()
    assert type(hf).__name__ == "GemmaTokenizer"
    assert (hf.pad_token_id, hf.eos_token_id, hf.bos_token_id, hf.unk_token_id) == (0, 1, 2, 3)
    assert hf.chat_template == CHAT_TEMPLATE_FILE.read_text()


def test_special_ids_at_gemma3_positions(tok: Tokenizer, hf) -> None:
    expected = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4, "[multimodal]": 5,
                "<unused0>": 6, "<unused98>": 104, "<start_of_turn>": 105, "<end_of_turn>": 106,
                "<0x00>": 107, "<0xFF>": 362}
    for piece, i in expected.items():
        assert tok.id_to_piece(i) == piece
        assert tok.piece_to_id(piece) == i
        assert hf.convert_tokens_to_ids(piece) == i
    assert (tok.PAD_ID, tok.EOS_ID, tok.BOS_ID, tok.UNK_ID) == (0, 1, 2, 3)
    assert (tok.START_OF_TURN_ID, tok.END_OF_TURN_ID) == (105, 106)
    assert tok.vocab_size == VOCAB_SIZE == len(hf)
    assert tok.stop_ids == {1, 106}


def test_load_errors_name_the_file(tmp_path: Path, tok_dir: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"tokenizer.model not found in {tmp_path}"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.model").write_bytes(b"\xff\xfe not a protobuf \x00\x01")
    with pytest.raises(ValueError, match="tokenizer.model"):
        Tokenizer.from_dir(tmp_path)
    # A valid model without Gemma's layout: <start_of_turn> missing at 105.
    data = (tok_dir / "tokenizer.model").read_bytes().replace(b"<start_of_turn>", b"<start_of_tprn>")
    (tmp_path / "tokenizer.model").write_bytes(data)
    with pytest.raises(ValueError, match="'<start_of_turn>' expected at id 105"):
        Tokenizer.from_dir(tmp_path)


def test_build_rejects_a_vocab_too_small_for_the_layout(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="vocab_size 300 out of range"):
        build_gemma_tokenizer(["hello world"], 300, tmp_path)


# ----------------------------------------------------------------------------- encode / decode

TRICKY = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "trailing space ",
    "  two leading, three   inner and two trailing  ",
    "line one\nline two\n\n\nafter blank lines\n",
    "\ttabbed\tcolumns\t",
    "digits 1234567890 and 3.14159, 1e-10, -42",
    "punctuation!? (parens) [brackets] {braces} <angle> 'quotes' \"double\" a->b == c; x_y",
    "def f(x):\n    return x ** 2  # comment",
    "日本語のテキスト",
    "emoji 😀👍🏽 and flag 🇫🇷",
    "café naïve Zürich",
    "xqzvjkwpfth",  # letters in an order the corpus never shows
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "a<bos>b <eos> c<pad>",
    " <start_of_turn> spaced ",
    "<start_of_turn",
    "<unused7><mask>[multimodal]<unk>",
    "literal <0x41> byte piece",
    "▁ the block character itself",
    "",
    " ",
    "\n",
]


@pytest.mark.parametrize("text", TRICKY)
def test_encode_equals_transformers(tok: Tokenizer, hf, text: str) -> None:
    assert tok.encode(text) == hf(text).input_ids
    assert tok.encode(text, add_bos=False) == hf(text, add_special_tokens=False).input_ids


def test_special_strings_become_single_ids(tok: Tokenizer) -> None:
    ids = tok.encode("<start_of_turn>user\nHi<end_of_turn>", add_bos=False)
    assert ids[0] == 105 and ids[-1] == 106
    assert tok.encode("<bos>", add_bos=False) == [2]


def test_non_ascii_uses_byte_fallback(tok: Tokenizer) -> None:
    ids = tok.encode("日", add_bos=False)
    assert [tok.id_to_piece(i) for i in ids] == ["<0xE6>", "<0x97>", "<0xA5>"]


def test_encode_equals_transformers_on_the_corpus(tok: Tokenizer, hf) -> None:
    for text in ascii_corpus()[::7]:
        assert tok.encode(text) == hf(text).input_ids


@pytest.mark.parametrize("text", TRICKY)
def test_decode_round_trips_and_equals_transformers(tok: Tokenizer, hf, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    # Lossy only where transformers is too: skipped special tokens vanish, "▁" reads back as " ".
    lossy = ("<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "\u2581")
    if not any(s in text for s in lossy):
        assert tok.decode(ids) == text


def test_decode_rejects_out_of_range_ids(tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="token id 5000 out of range"):
        tok.decode([5, 5000])


# ----------------------------------------------------------------------------- chat template

SPEC_EXAMPLE = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "  Hi there "},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "2+2?"},
]
# Spec §5, rendered there independently with jinja through apply_chat_template.
SPEC_RENDERED = (
    "<bos><start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n<start_of_turn>model\nHello."
    "<end_of_turn>\n<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n"
)

CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "What is the capital of France?"}],
    "system_user": [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Colour?"}],
    "spec_example": SPEC_EXAMPLE,
    "list_content": [
        {"role": "user", "content": [{"type": "text", "text": "  Describe "}, {"type": "text", "text": " this.\n"}]},
        {"role": "model", "content": [{"type": "text", "text": "It is a test."}]},
        {"role": "user", "content": "And <start_of_turn> inside?"},
    ],
    "system_list": [
        {"role": "system", "content": [{"type": "text", "text": " Be kind. "}]},
        {"role": "user", "content": "日本語 😀\n\tok"},
    ],
}


def hf_chat_ids(hf, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    out = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    return list(out["input_ids"]) if not isinstance(out, list) else out  # v5 returns a BatchEncoding


def test_render_matches_the_spec_string() -> None:
    assert render_chat(SPEC_EXAMPLE) == SPEC_RENDERED


@pytest.mark.parametrize("gen", [True, False], ids=["gen_prompt", "no_gen_prompt"])
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_chat_equals_transformers(tok: Tokenizer, hf, name: str, gen: bool) -> None:
    messages = CONVERSATIONS[name]
    assert render_chat(messages, gen) == hf.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=gen
    )
    ids = chat_token_ids(tok, messages, add_generation_prompt=gen)
    assert ids == hf_chat_ids(hf, messages, gen)
    assert ids[0] == 2 and ids[1] != 2  # one BOS, from the template


BAD_ORDER = {
    "model_first": ([{"role": "assistant", "content": "hi"}], "message 0: role 'assistant'"),
    "two_users": ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "message 1: role 'user'"),
    "system_then_model": (
        [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}], "message 1: role 'assistant'"
    ),
    "two_models": (
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "model", "content": "c"}],
        "message 2: role 'model'",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_ORDER))
def test_alternation_errors_raise_like_the_template(hf, name: str) -> None:
    messages, message = BAD_ORDER[name]
    with pytest.raises(ValueError, match=message):
        render_chat(messages)
    with pytest.raises(Exception, match="must alternate"):
        hf.apply_chat_template(messages, tokenize=False)


@pytest.mark.parametrize(
    "messages, message",
    [
        ([], "empty"),
        ([{"role": "system", "content": "s"}], "needs a user turn"),
        ([{"role": "user", "content": "a"}, {"role": "system", "content": "s"}], "message 1: role 'system'"),
        ([{"role": "user", "content": [{"type": "image"}]}], "item 0: images are not supported"),
        ([{"role": "user", "content": None}], "message 0 \\(user\\): content must be"),
        ([{"role": "user"}], "missing 'content'"),
    ],
)
def test_unsupported_conversations_raise(messages: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        render_chat(messages)


# ----------------------------------------------------------------------------- streaming

STREAMED = ["日本語のテキスト", "emoji 😀👍🏽 mixed with ascii", "café\nnaïve 🇫🇷 Zürich", "a😀b日c"]


@pytest.mark.parametrize("text", STREAMED)
def test_incremental_detokenizer_never_splits_a_character(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert sum(tok.id_to_piece(i).startswith("<0x") for i in ids) >= 2, "input must use byte fallback"
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.add(i) for i in ids] + [detok.flush()]
    assert not any("\ufffd" in p for p in pieces)
    assert "".join(pieces) == tok.decode(ids) == text
    assert "" in pieces  # some ids completed no character: the text was held back, not broken


@pytest.mark.parametrize("text", STREAMED)
def test_naive_per_token_decode_breaks_characters(tok: Tokenizer, text: str) -> None:
    """Negative control: decoding each id alone does emit U+FFFD on these inputs."""
    ids = tok.encode(text)
    assert any("\ufffd" in tok.decode([i]) for i in ids)


def test_incremental_detokenizer_matches_decode_on_invalid_bytes(tok: Tokenizer) -> None:
    """Ids a model may sample in any order: broken byte runs become U+FFFD in both paths alike."""
    e6, x97, xa5, a = 107 + 0xE6, 107 + 0x97, 107 + 0xA5, tok.encode("a", add_bos=False)[0]
    for ids in ([e6, x97, a], [e6, x97], [x97, xa5, e6, x97, xa5], [e6, 2, x97, xa5], [xa5, 105, e6]):
        detok = IncrementalDetokenizer(tok)
        assert "".join(detok.add(i) for i in ids) + detok.flush() == tok.decode(ids)
    assert tok.decode([e6, x97, a]) == "\ufffd\ufffda"


def test_added_token_matcher_is_leftmost_longest() -> None:
    added = AddedPieces({w: i for i, w in enumerate(["ab", "abcd", "abc", "b", "x.y"])})
    text = "abcx abcdd ab bx.y xzy"
    assert [text[s:e] for s, e, _ in added.find(text)] == ["abc", "abcd", "ab", "b", "x.y"]
    assert [i for _, _, i in added.find(text)] == [2, 1, 0, 3, 4] and list(AddedPieces({}).find(text)) == []
