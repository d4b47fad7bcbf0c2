"""Streaming detokenization: text out as token ids come in, never half a character.

Gemma's decoder is a plain concatenation of per-token bytes (see `tokenizer.py`): no dummy-prefix
space to strip, no clean-up between tokens. So instead of re-decoding a window of recent ids
(the prefix-offset / read-offset technique that tokenizers with context-dependent decoding need),
the stream is decoded bytewise with an incremental UTF-8 decoder. The only state is the tail of a
character still waiting for its remaining byte-fallback pieces: at most 3 bytes. Each `add` is O(1)
and the concatenation of everything emitted equals `Tokenizer.decode(all_ids)`.
"""

from __future__ import annotations

import codecs

from .tokenizer import REPLACE_ESCAPED_BYTES, Tokenizer


class IncrementalDetokenizer:
    """Turns one sequence's token ids into text, one id at a time.

    Contract: `"".join(add(i) for i in ids) + flush() == tokenizer.decode(ids)`, and no returned
    piece ends inside a multi-byte character. A byte that can never start or continue a valid
    UTF-8 character is emitted as U+FFFD as soon as that is certain.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        self.num_tokens = 0  # ids added so far

    def add(self, token_id: int) -> str:
        """Feed one id; return the text it completes ("" while a character is still partial)."""
        if not 0 <= token_id < self._tokenizer.vocab_size:
            raise ValueError(
                f"token id {token_id} out of range for {self._tokenizer.source} "
                f"(vocab size {self._tokenizer.vocab_size})"
            )
        self.num_tokens += 1
        text = self._utf8.decode(self._tokenizer.token_bytes(token_id))
        return text.translate(REPLACE_ESCAPED_BYTES)

    def flush(self) -> str:
        """End of sequence: return what is left (an unfinished character becomes U+FFFD per byte)."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text.translate(REPLACE_ESCAPED_BYTES)
