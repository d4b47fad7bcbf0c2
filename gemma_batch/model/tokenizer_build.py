"""Train a small SentencePiece BPE tokenizer with Gemma 3's special-token layout.

Used by the tests and by the script that builds the bundled demo model: the real Gemma 3 vocab
(262 144 pieces) is far too big for tiny models, but the engine must see the same ids for the
same special tokens, and transformers must load the folder exactly as it loads a hub Gemma 3
tokenizer. The layout written here:

    0 <pad>   1 <eos>   2 <bos>   (control pieces)       3 <unk>   (unknown piece)
    4 <mask>  5 [multimodal]  6..104 <unused0>..<unused98>  105 <start_of_turn>  106 <end_of_turn>
    (user-defined pieces, matched whole in the text)
    107..362 <0x00>..<0xFF>   (byte-fallback pieces)
    363..    ordinary BPE pieces, best merge first

The trainer options mirror Gemma's: BPE with byte fallback, no dummy-prefix space, identity
normalization (no NFKC), extra whitespace kept, digits split one per piece, whitespace-only
pieces allowed.
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from types import MappingProxyType

import sentencepiece as spm

# The Gemma 3 user-defined pieces in id order, starting at id 4.
GEMMA3_USER_SYMBOLS: tuple[str, ...] = (
    "<mask>",
    "[multimodal]",
    *(f"<unused{i}>" for i in range(99)),
    "<start_of_turn>",
    "<end_of_turn>",
)
NUM_META_PIECES = 4 + len(GEMMA3_USER_SYMBOLS)  # 107: ids 0..106
NUM_BYTE_PIECES = 256
MIN_VOCAB_SIZE = NUM_META_PIECES + NUM_BYTE_PIECES + 1  # 364: at least one ordinary piece
MAX_VOCAB_SIZE = 65_536  # a sanity bound for a corpus held in memory, not a SentencePiece limit

CHAT_TEMPLATE_FILE = Path(__file__).with_name("gemma3_chat_template.jinja")

_TOKENIZER_CONFIG = MappingProxyType({
    "tokenizer_class": "GemmaTokenizer",
    "bos_token": "<bos>",
    "eos_token": "<eos>",
    "pad_token": "<pad>",
    "unk_token": "<unk>",
    "mask_token": "<mask>",
    "add_bos_token": True,
    "add_eos_token": False,
    "padding_side": "left",
    "clean_up_tokenization_spaces": False,
})


def _trainer_options(vocab_size: int) -> dict[str, object]:
    """SentencePiece trainer options reproducing Gemma 3's layout and normalization."""
    return dict(
        model_type="bpe",
        vocab_size=vocab_size,
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        user_defined_symbols=list(GEMMA3_USER_SYMBOLS),
        byte_fallback=True,
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        split_digits=True,
        allow_whitespace_only_pieces=True,
        split_by_whitespace=True,
        character_coverage=1.0,
        max_sentence_length=1 << 16,
        # One thread keeps the output byte-identical from run to run.
        num_threads=1,
        minloglevel=2,
    )


def train_sentencepiece(texts: Iterable[str], vocab_size: int) -> bytes:
    """Train the Gemma-layout BPE model on `texts` and return the serialized `tokenizer.model`.

    Args:
        texts: training sentences (any length up to 64 KiB each; newlines and tabs are kept).
        vocab_size: total pieces, special and byte pieces included; in
            [MIN_VOCAB_SIZE, MAX_VOCAB_SIZE].
    Returns:
        The ModelProto bytes. Same texts and vocab_size give the same bytes.
    Raises:
        ValueError: the vocab size is out of range, or the corpus is too small to reach it.
    """
    if not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size {vocab_size} out of range: the Gemma layout needs {NUM_META_PIECES} special and "
            f"{NUM_BYTE_PIECES} byte pieces, so use {MIN_VOCAB_SIZE}..{MAX_VOCAB_SIZE}"
        )
    sentences = [t for t in texts if t]
    if not sentences:
        raise ValueError("cannot train a tokenizer on an empty corpus")
    buf = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=buf, **_trainer_options(vocab_size)
        )
    except RuntimeError as e:
        raise ValueError(
            f"SentencePiece training failed for vocab_size {vocab_size} on {len(sentences)} sentences "
            f"(a corpus too small for the vocab gives 'Vocabulary size too high'): {e}"
        ) from e
    return buf.getvalue()


def build_gemma_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: Path) -> Path:
    """Train a Gemma-3-layout tokenizer and write a folder that transformers loads as Gemma 3's.

    Writes `out_dir/tokenizer.model`, `out_dir/tokenizer_config.json` (GemmaTokenizer, bos/eos/pad/
    unk/mask, add_bos_token) and `out_dir/chat_template.jinja` (Google's Gemma 3 template), creating
    `out_dir` if needed.

    Args:
        texts: the training corpus, one string per sentence or paragraph.
        vocab_size: total number of pieces (see `train_sentencepiece`).
        out_dir: the folder to write.
    Returns:
        The path of the written `tokenizer.model`.
    """
    out_dir = Path(out_dir)
    model_bytes = train_sentencepiece(texts, vocab_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    model_path = out_dir / "tokenizer.model"
    model_path.write_bytes(model_bytes)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(dict(_TOKENIZER_CONFIG), indent=2) + "\n")
    shutil.copyfile(CHAT_TEMPLATE_FILE, out_dir / "chat_template.jinja")
    return model_path
