"""The KV cache sized for a job's rows (job/row_bound.py, engine/kv_plan.fit_to_rows): the bound
holds for every row the real tokenizer makes, and the cut plan holds those rows at once."""

from __future__ import annotations

from gemma_batch.data.rows import InputRow
from gemma_batch.engine.kv_plan import blocks_per_sequence, fit_to_rows, plan_kv
from gemma_batch.job.row_bound import row_bound
from gemma_batch.job.spec import DEMO_MODEL
from gemma_batch.model.chat import chat_token_ids
from gemma_batch.model.config import Gemma3Config
from gemma_batch.model.tokenizer import Tokenizer


def test_a_row_never_takes_more_tokens_than_its_bound():
    """Texts whose pieces are as short as they get (bytes of a rare script, one a piece), chat rows,
    overrides of max_tokens, choices, and rows that fail (which count for nothing)."""
    tok = Tokenizer.from_dir(DEMO_MODEL)
    rows = [InputRow(0, "a", prompt="hello there, general"),
            InputRow(1, "b", prompt="\U0001f600\u0b95\u0e01 zq\x01" * 7, params={"max_tokens": 40}),
            InputRow(2, "c", messages=[{"role": "user", "content": "hi <start_of_turn> there"}]),
            InputRow(3, "d", prompt="x", choices=("positive", "very negative")),
            InputRow(4, "e", error="not JSON"),
            InputRow(5, "f", messages=[{"role": "assistant", "content": "starts wrong"}])]
    for row in rows[:4]:
        one = row_bound([row], 16, ())
        ids = chat_token_ids(tok, row.messages) if row.messages else tok.encode(row.prompt)
        new = max(len(tok.encode(" " + c, add_bos=False)) for c in row.choices) if row.choices else row.params.get("max_tokens", 16)
        assert one.rows == 1 and len(ids) + new <= one.tokens, row
    both = row_bound(rows, 16, ())
    assert both.rows == 4 and both.tokens == max(row_bound([r], 16, ()).tokens for r in rows[:4])
    assert row_bound(rows[:1], 16, ("yes", "no")).tokens == len("hello there, general") + 1 + len("yes") + 1


def test_the_cut_plan_holds_the_rows_at_once_and_never_grows():
    cfg = Gemma3Config.from_dir(DEMO_MODEL)
    groups = cfg.kv_groups()
    per_token = {g.name: 1024 for g in groups}
    plan = plan_kv(groups, per_token, 2**30, 16, 2048, 32, 512)
    cut = fit_to_rows(plan, groups, per_token, rows=5, tokens=300, max_batch=32, max_chunk=512)
    assert cut.max_model_len == plan.max_model_len and cut.sized_for == 300 and cut.full_length_seqs == 5
    for g in groups:
        assert cut.num_blocks[g.name] == 5 * blocks_per_sequence(g, 300, 16, 512) <= plan.num_blocks[g.name]
    assert cut.used_bytes == sum(n * 1024 * 16 for n in cut.num_blocks.values()) < plan.used_bytes
    assert "sized for this job: 5 row(s) at once of up to 300 tokens" in cut.describe(groups)
    many = fit_to_rows(plan, groups, per_token, rows=10_000, tokens=5000, max_batch=32, max_chunk=512)
    assert many.num_blocks == plan.num_blocks  # (capped by the plan: rows longer than max_model_len cannot run)
    none = fit_to_rows(plan, groups, per_token, rows=0, tokens=0, max_batch=32, max_chunk=512)
    assert all(n >= 1 for n in none.num_blocks.values())
