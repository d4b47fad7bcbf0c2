"""The columns of the completion dataset (`gemma-batch run`'s output)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pyarrow as pa

FINISH_REASONS = ("stop", "length", "scored", "error")  # scored: --score-only, no completion
TOKEN_FIELDS = [("token_id", pa.int64()), ("token", pa.string()), ("logprob", pa.float64())]

# Fixed columns, in output order. Sampling columns hold the effective values the row ran with
# (job flags with the row's overrides applied); they are null on rows that failed before running.
BASE_FIELDS = (
    pa.field("row", pa.int64(), nullable=False),  # 0-based index of the row in the input
    pa.field("id", pa.string()),  # null on an error row whose id could not be read
    # what the completion depends on besides the job's settings (job/incremental.py): a rerun
    # over a changed input keeps a finished row whose id and request_hash it meets again
    pa.field("request_hash", pa.string(), nullable=False),
    pa.field("completion", pa.string()),  # null on error rows and --score-only rows
    pa.field("finish_reason", pa.string(), nullable=False),  # one of FINISH_REASONS
    pa.field("prompt_tokens", pa.int64()),
    # of them, those whose K/V came from the prefix cache (a start another row computed); null on error rows
    pa.field("cached_prompt_tokens", pa.int64()),
    pa.field("completion_tokens", pa.int64()),
    pa.field("max_tokens", pa.int64()),
    pa.field("temperature", pa.float64()),
    pa.field("top_k", pa.int64()),
    pa.field("top_p", pa.float64()),
    pa.field("min_p", pa.float64()),
    pa.field("seed", pa.int64()),
    pa.field("stop", pa.list_(pa.string())),
    # rows answered from `choices`: each choice's log-probability (its tokens' sum) and its
    # probability normalised over the choices; null on other rows (engine/choices.py)
    pa.field("choice_logprobs", pa.list_(pa.struct([
        ("choice", pa.string()), ("logprob", pa.float64()), ("probability", pa.float64())]))),
    # with --logprobs K (or a row's): per generated token, its log-probability and the K most
    # likely alternatives (engine/token_logprobs.py); null on other rows
    pa.field("logprobs", pa.list_(pa.struct([*TOKEN_FIELDS, ("top_logprobs", pa.list_(pa.struct(TOKEN_FIELDS)))]))),
    pa.field("error", pa.string()),  # why the row failed; null on success
)


def check_keep_names(names: Iterable[str]) -> None:
    """ValueError where a kept column is named like an output column."""
    clash = sorted(set(names) & {f.name for f in BASE_FIELDS})
    if clash:
        raise ValueError(f"--keep-columns {', '.join(clash)}: name(s) clash with output columns")


def output_schema(keep_types: Mapping[str, pa.DataType]) -> pa.Schema:
    """The output schema: the fixed columns, then the kept input columns with their types."""
    check_keep_names(keep_types)
    return pa.schema([*BASE_FIELDS, *(pa.field(name, t) for name, t in keep_types.items())])
