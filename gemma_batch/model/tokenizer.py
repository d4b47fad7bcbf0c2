"""The Gemma 3 tokenizer: SentencePiece BPE with byte fallback, read from `tokenizer.model`.

The ids match what transformers 5.x gives for the same `tokenizer.model` (it converts the file
to a `tokenizers` BPE: `GemmaTokenizer`, merges ranked by piece id). Its pipeline, reproduced here:

1. **Added tokens first.** Every control piece (`<pad>`, `<eos>`, `<bos>`), the `<unk>` piece and
   every user-defined piece (`<mask>`, `[multimodal]`, `<unusedN>`, `<start_of_turn>`,
   `<end_of_turn>`, ...) is cut out of the raw text, leftmost-longest, and becomes its single id.
   So "<bos>" typed in a prompt is id 2, exactly as in transformers (SentencePiece alone would
   spell control pieces out character by character).
2. **BPE on the text between them.** Spaces become "▁", nothing else is normalized: no NFKC, no
   dummy-prefix space, no whitespace collapsing, no pre-tokenizer split. Characters outside the
   vocab fall back to one `<0xXX>` piece per UTF-8 byte. SentencePiece's BPE (highest-scoring
   merge first, then leftmost) gives the same pieces as the converted merge table, so it does the
   work; the file's normalizer settings are overridden to the ones above before loading.
3. **`<bos>` in front** when `add_bos` (transformers' `add_special_tokens=True`).

Decoding is a plain concatenation of each piece's bytes ("▁" -> " ", `<0xXX>` -> that byte), the
whole byte string then read as UTF-8 (transformers' `Replace`, `ByteFallback`, `Fuse` decoders).
Named special tokens (pad, eos, bos, unk, mask) are skipped, as `skip_special_tokens=True` does.
A byte that belongs to no valid UTF-8 character becomes one U+FFFD (transformers replaces a whole
run of byte pieces when any of it is invalid; the two agree on every valid run).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from functools import cached_property
from pathlib import Path
from types import MappingProxyType

import sentencepiece as spm
from google.protobuf.message import DecodeError
from sentencepiece import sentencepiece_model_pb2 as sp_pb2

PAD_ID = 0
EOS_ID = 1
BOS_ID = 2
UNK_ID = 3
START_OF_TURN_ID = 105
END_OF_TURN_ID = 106

# The pieces this engine relies on, at Gemma 3's ids. The file must hold each at its id.
GEMMA3_SPECIAL_PIECES = MappingProxyType({
    "<pad>": PAD_ID,
    "<eos>": EOS_ID,
    "<bos>": BOS_ID,
    "<unk>": UNK_ID,
    "<start_of_turn>": START_OF_TURN_ID,
    "<end_of_turn>": END_OF_TURN_ID,
})
# transformers' GemmaTokenizer names these five as its special tokens; decode skips them.
_NAMED_SPECIAL_PIECES = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")

_PieceType = sp_pb2.ModelProto.SentencePiece.Type
# Piece types that transformers turns into added tokens, matched whole in the raw text.
_ADDED_TYPES = frozenset((_PieceType.CONTROL, _PieceType.UNKNOWN, _PieceType.USER_DEFINED))
_BYTE = _PieceType.BYTE
_BPE = sp_pb2.TrainerSpec.ModelType.BPE

# Lone surrogates U+DC80..U+DCFF are what "surrogateescape" makes of undecodable bytes.
REPLACE_ESCAPED_BYTES = MappingProxyType({0xDC80 + b: "\ufffd" for b in range(128)})


class AddedPieces:
    """Finds the added pieces in raw text, leftmost-longest (step 1 of the module doc): at each
    place where some piece starts (one character class search), the longest piece there wins.
    Building it is a dict of the pieces, where a regex alternation of Gemma 3's 6,000-odd pieces
    took longer to compile than the rest of the tokenizer to load."""

    def __init__(self, ids: dict[str, int]) -> None:
        self.ids = ids
        lengths: dict[str, set[int]] = {}
        for piece in ids:
            lengths.setdefault(piece[0], set()).add(len(piece))
        self._lengths = {first: sorted(found, reverse=True) for first, found in lengths.items()}
        self._starts = re.compile("[" + "".join(map(re.escape, sorted(lengths))) + "]") if lengths else None

    def find(self, text: str) -> Iterator[tuple[int, int, int]]:
        """(start, end, id) of each added piece in `text`, left to right, not overlapping."""
        pos = 0
        while self._starts is not None and (m := self._starts.search(text, pos)):
            start = m.start()
            for length in self._lengths[text[start]]:
                token_id = self.ids.get(text[start:start + length])
                if token_id is not None:
                    yield start, start + length, token_id
                    pos = start + length
                    break
            else:
                pos = start + 1


class Tokenizer:
    """Gemma 3 text tokenizer (encode / decode); build with `Tokenizer.from_dir`."""

    PAD_ID = PAD_ID
    EOS_ID = EOS_ID
    BOS_ID = BOS_ID
    UNK_ID = UNK_ID
    START_OF_TURN_ID = START_OF_TURN_ID
    END_OF_TURN_ID = END_OF_TURN_ID

    def __init__(self, proto: sp_pb2.ModelProto, source: str) -> None:
        """Wrap a parsed `ModelProto` (taken: its normalizer is changed); `source` names the file
        in error messages."""
        self.source = source
        pieces = proto.pieces
        if proto.trainer_spec.model_type != _BPE or not proto.trainer_spec.byte_fallback:
            raise ValueError(f"{source} is not a Gemma 3 tokenizer: it must be a BPE model with byte_fallback")
        for piece, want in GEMMA3_SPECIAL_PIECES.items():
            found = pieces[want].piece if want < len(pieces) else None
            if found != piece:
                raise ValueError(
                    f"{source} is not a Gemma 3 tokenizer: piece {piece!r} expected at id {want}, "
                    f"found {found!r} ({len(pieces)} pieces in the file)"
                )
        # (reading the protobuf's fields costs more than anything done with them: the types in one
        # pass, the added pieces' strings; every piece's string from SentencePiece when first asked)
        self._kinds = [p.type for p in pieces]
        self._added = AddedPieces({pieces[i].piece: i for i, kind in enumerate(self._kinds) if kind in _ADDED_TYPES})
        self._skip_ids = frozenset(i for i in map(self._added.ids.get, _NAMED_SPECIAL_PIECES) if i is not None)  # (all added)
        self._bytes: dict[int, bytes] = {}  # id -> UTF-8 bytes ("▁" already a space), made as first decoded
        # transformers' converted tokenizer normalizes only " " -> "▁"; make SentencePiece do the same.
        spec = proto
        norm = spec.normalizer_spec
        norm.name = "identity"
        norm.precompiled_charsmap = b""
        norm.add_dummy_prefix = False
        norm.remove_extra_whitespaces = False
        norm.escape_whitespaces = True
        spec.trainer_spec.treat_whitespace_as_suffix = False
        self._sp = spm.SentencePieceProcessor(model_proto=spec.SerializeToString())

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """Load a SentencePiece `tokenizer.model` file.

        Raises:
            FileNotFoundError: the file does not exist.
            ValueError: the file is not a readable SentencePiece model, or not Gemma 3's layout.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path.name} not found in {path.parent}")
        data = path.read_bytes()
        proto = sp_pb2.ModelProto()
        try:
            proto.ParseFromString(data)
        except DecodeError as e:
            raise ValueError(f"{path} is not a SentencePiece model (protobuf parse failed: {e})") from e
        if not proto.pieces:
            raise ValueError(f"{path} is not a SentencePiece model: it holds no pieces ({len(data)} bytes)")
        try:
            return cls(proto, str(path))
        except RuntimeError as e:  # SentencePiece rejected the model
            raise ValueError(f"{path} could not be loaded by SentencePiece: {e}") from e

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Tokenizer:
        """Load `tokenizer.model` from a Hugging Face model folder (see `from_file`)."""
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.model"
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer.model not found in {model_dir}")
        return cls.from_file(path)

    @property
    def vocab_size(self) -> int:
        """Number of pieces in the file (ids 0..vocab_size-1)."""
        return len(self._kinds)

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids an instruction-tuned Gemma 3 stops on: `<eos>` and `<end_of_turn>`."""
        return frozenset((EOS_ID, END_OF_TURN_ID))

    def id_to_piece(self, token_id: int) -> str:
        """The piece string of `token_id` (e.g. "▁the", "<0x0A>", "<bos>")."""
        if not 0 <= token_id < len(self._kinds):
            raise IndexError(f"token id {token_id} is outside the vocabulary (0..{len(self._kinds) - 1})")
        return self._sp.id_to_piece(token_id)

    def piece_to_id(self, piece: str) -> int | None:
        """The id of `piece`, or None if the vocabulary lacks it."""
        return self._piece_ids.get(piece)

    @cached_property
    def _piece_ids(self) -> dict[str, int]:
        pieces = self._sp.id_to_piece(list(range(self.vocab_size)))
        return {piece: i for i, piece in reversed(list(enumerate(pieces)))}  # first id wins

    def is_skipped(self, token_id: int) -> bool:
        """Whether decode drops `token_id` (pad, eos, bos, unk, mask)."""
        return token_id in self._skip_ids

    def token_bytes(self, token_id: int) -> bytes:
        """The UTF-8 bytes `token_id` contributes to decoded text (b"" for skipped ids)."""
        return b"" if token_id in self._skip_ids else self.piece_bytes(token_id)

    def piece_bytes(self, token_id: int) -> bytes:
        """The bytes of `token_id`'s piece, special pieces spelled out (b"<eos>")."""
        made = self._bytes.get(token_id)
        if made is None:
            piece = self.id_to_piece(token_id)
            made = self._bytes[token_id] = (bytes([int(piece[3:5], 16)]) if self._kinds[token_id] == _BYTE
                                            else piece.replace("▁", " ").encode())
        return made

    @property
    def added_ids(self) -> list[int]:
        """Ids of the pieces cut out of raw text whole (control, unknown and user-defined: step 1 of
        the module doc), ascending."""
        return sorted(self._added.ids.values())

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of `text`, equal to transformers' `tokenizer(text).input_ids` (with
        `add_special_tokens=add_bos`). Special-token strings in the text become their ids."""
        return self.encode_batch([text], add_bos)[0]

    def encode_batch(self, texts: Sequence[str], add_bos: bool = True, threads: int = 1) -> list[list[int]]:
        """`encode` of each of `texts`, their plain stretches in one call to SentencePiece on
        `threads` threads (which lets other Python threads run meanwhile). UnicodeEncodeError (a
        ValueError) for a text that is not Unicode (a lone surrogate)."""
        split = [self._split(text) for text in texts]
        plain = [part for parts in split for part in parts if isinstance(part, str)]
        try:
            encoded = iter(self._sp.encode(plain, num_threads=threads) if plain else ())
        except (TypeError, RuntimeError):  # (SentencePiece's words for it say nothing of the text)
            for part in plain:
                part.encode("utf-8")
            raise
        out = []
        for parts in split:
            ids = [BOS_ID] if add_bos else []
            for part in parts:
                if isinstance(part, str):
                    ids += next(encoded)
                else:
                    ids.append(part)
            out.append(ids)
        return out

    def _split(self, text: str) -> list[str | int]:
        """`text` as its plain stretches (str) and added pieces (their ids), in order."""
        parts: list[str | int] = []
        pos = 0
        for start, end, token_id in self._added.find(text):
            if start > pos:
                parts.append(text[pos:start])
            parts.append(token_id)
            pos = end
        if pos < len(text):
            parts.append(text[pos:])
        return parts

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, skipping pad/eos/bos/unk/mask, like transformers'
        `decode(ids, skip_special_tokens=True)`. Undecodable bytes become U+FFFD, one per byte."""
        n = self.vocab_size
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise ValueError(f"token id {bad[0]} out of range for {self.source} (vocab size {n})")
        data = b"".join(self.token_bytes(i) for i in ids)
        return data.decode("utf-8", "surrogateescape").translate(REPLACE_ESCAPED_BYTES)
