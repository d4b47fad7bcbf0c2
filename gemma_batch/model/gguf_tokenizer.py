"""Gemma 3's SentencePiece tokenizer, rebuilt from a GGUF file's vocabulary.

A GGUF keeps SentencePiece's pieces, scores and types (`tokenizer.ggml.tokens`, `.scores`,
`.token_type`; GGML's type numbers are SentencePiece's), except for the pieces transformers'
`added_tokens_decoder` lists: llama.cpp gave those score -1000 and type CONTROL or USER_DEFINED,
and wrote "▁" in USER_DEFINED ones as a plain space (Gemma's whitespace-run pieces). Rebuilt with
these rules, ids equal transformers' and llama.cpp's (measured on the real 270M: docs in the
project's shared folder, `gguf_notes.md`; `tests/test_gguf.py`):

- "▁" comes back in USER_DEFINED pieces;
- the unknown piece is UNKNOWN, the pad, eos and bos pieces CONTROL, and every other CONTROL piece
  (`<mask>`, `<unusedN>`, `<start_of_turn>`, ...) USER_DEFINED, so that text holding it encodes
  it whole, as Gemma's own tokenizer does;
- control, byte and user-defined pieces score 0; normal pieces keep their scores;
- Gemma's normalizer: identity, no dummy-prefix space, whitespace kept; BPE with byte fallback.
"""

from __future__ import annotations

from typing import Any

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # SentencePiece's (and GGML's) types
SPACE = "\u2581"  # "▁", SentencePiece's whitespace


def sentencepiece_model(vocab: dict[str, Any]) -> bytes:
    """The serialized SentencePiece ModelProto (`tokenizer.model`) for a GGUF's vocabulary:
    `vocab` holds the metadata `tokens`, `scores`, `token_type` (lists) and the ids `unk`, `pad`,
    `eos`, `bos`."""
    from sentencepiece import sentencepiece_model_pb2 as pb  # (protobuf, a dependency of ours)

    tokens, scores, types = vocab["tokens"], vocab["scores"], vocab["token_type"]
    if not len(tokens) == len(scores) == len(types):
        raise ValueError(f"the vocabulary's lists differ in length: {len(tokens)} tokens, {len(scores)} scores, "
                         f"{len(types)} types")
    special = {vocab["pad"]: CONTROL, vocab["eos"]: CONTROL, vocab["bos"]: CONTROL, vocab["unk"]: UNKNOWN}
    model = pb.ModelProto()
    for i, (piece, score, kind) in enumerate(zip(tokens, scores, types)):
        kind = special.get(i, USER_DEFINED if kind in (CONTROL, USER_DEFINED) else int(kind))
        if kind == USER_DEFINED:
            piece = piece.replace(" ", SPACE)
        model.pieces.add(piece=piece, score=float(score) if kind == NORMAL else 0.0, type=kind)
    trainer = model.trainer_spec
    trainer.model_type = pb.TrainerSpec.BPE
    trainer.vocab_size = len(tokens)
    trainer.byte_fallback = True
    trainer.unk_id, trainer.bos_id, trainer.eos_id, trainer.pad_id = vocab["unk"], vocab["bos"], vocab["eos"], vocab["pad"]
    trainer.unk_piece, trainer.bos_piece = tokens[vocab["unk"]], tokens[vocab["bos"]]
    trainer.eos_piece, trainer.pad_piece = tokens[vocab["eos"]], tokens[vocab["pad"]]
    trainer.split_digits = True
    trainer.allow_whitespace_only_pieces = True
    normalizer = model.normalizer_spec
    normalizer.name = "identity"
    normalizer.add_dummy_prefix = False
    normalizer.remove_extra_whitespaces = False
    normalizer.escape_whitespaces = True
    return model.SerializeToString()
