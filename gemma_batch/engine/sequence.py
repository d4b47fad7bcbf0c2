"""One sequence moving through the engine: its tokens, how many are cached, and its KV blocks."""

from __future__ import annotations

from dataclasses import dataclass, field

PENDING = -1  # in `token_ids`: a token the device is still sampling (see `append_pending`)


@dataclass(eq=False)  # identity: two sequences are never "equal"
class Sequence:
    """A prompt and its growing completion.

    `num_cached_tokens` counts the tokens whose K/V are in the cache; the tokens after them are
    still to be fed to the model (the rest of the prompt, or the last sampled token).
    `block_tables` holds, per KV group, the block id for each `block_size` span of positions,
    or -1 for a span whose block was released (it left the sliding window).
    """

    seq_id: int
    token_ids: list[int]
    num_prompt_tokens: int
    max_new_tokens: int
    stop_token_ids: frozenset[int] = frozenset()
    num_cached_tokens: int = 0
    block_tables: dict[str, list[int]] = field(default_factory=dict)
    finished: bool = False
    prefix_keys: list[bytes] | None = None  # keys of its full prompt blocks, once prefix caching asked (kv_cache)
    num_registered_blocks: int = 0  # its first table entries cached under their keys
    num_prompt_tokens_hit: int = 0  # prompt tokens its (last) admission took from the prefix cache

    @classmethod
    def from_prompt(
        cls, seq_id: int, prompt_ids: list[int], max_new_tokens: int, stop_token_ids: frozenset[int] = frozenset()
    ) -> Sequence:
        if not prompt_ids:
            raise ValueError(f"sequence {seq_id}: empty prompt")
        return cls(seq_id, list(prompt_ids), len(prompt_ids), max_new_tokens, stop_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def completion_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_uncached_tokens(self) -> int:
        return len(self.token_ids) - self.num_cached_tokens

    @property
    def num_next_tokens(self) -> int:
        """The most tokens the next step may feed: while in the prompt, up to its end; then every
        uncached token. So a step never feeds a sequence's prompt tokens with its others (a
        preempted sequence's recomputed completion): a backend may sum a prompt token's products
        in another order (StepBatch.prompt_lens)."""
        return self.num_prompt_tokens - self.num_cached_tokens if self.feeds_prompt else self.num_uncached_tokens

    @property
    def feeds_prompt(self) -> bool:
        """Whether the next step feeds this sequence's prompt tokens."""
        return self.num_cached_tokens < self.num_prompt_tokens

    def append(self, token_id: int) -> None:
        """Add a sampled token; finish on a stop token or when the completion is long enough."""
        self.token_ids.append(token_id)
        self._check_end(len(self.token_ids) - 1)

    def append_pending(self) -> None:
        """Hold the place of a token still being sampled, so that the next step can be scheduled
        (and submitted) meanwhile; `resolve` puts the token in (and only then are the stop rules
        applied). With steps submitted ahead, a sequence holds a place for each of them; they
        are resolved in order."""
        self.token_ids.append(PENDING)

    @property
    def num_pending(self) -> int:
        """Tokens at the end of `token_ids` still being sampled."""
        n = 0
        while n < len(self.token_ids) and self.token_ids[-1 - n] == PENDING:
            n += 1
        return n

    def resolve(self, token_id: int) -> None:
        """Put in the oldest pending token, then apply the stop rules to it."""
        i = len(self.token_ids) - self.num_pending
        self.token_ids[i] = token_id
        self._check_end(i)

    def end(self) -> None:
        """End the sequence at its last sampled token (a stop string met): a place held after it
        for a step already submitted is dropped."""
        self.finished = True
        del self.token_ids[len(self.token_ids) - self.num_pending:]

    @property
    def at_length_limit(self) -> bool:
        return self.num_completion_tokens >= self.max_new_tokens

    def _check_end(self, i: int) -> None:
        """End at token i if it is a stop token or the completion's last."""
        if self.token_ids[i] in self.stop_token_ids or i + 1 - self.num_prompt_tokens >= self.max_new_tokens:
            self.end()
