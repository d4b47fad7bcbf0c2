"""The demo model on the CPU backend and an engine run to the end: shared by the engine-level
tests of constraints, choices and log-probabilities."""

from __future__ import annotations

from gemma_batch.backends import create_backend
from gemma_batch.backends.base import Backend
from gemma_batch.engine.engine import Engine
from gemma_batch.engine.kv_plan import KVPlan, blocks_per_sequence
from gemma_batch.engine.request import Completion, Request
from gemma_batch.job.spec import DEMO_MODEL
from gemma_batch.model.checkpoint import Checkpoint
from gemma_batch.model.config import Gemma3Config
from gemma_batch.model.tokenizer import Tokenizer


def demo_cpu() -> tuple[Backend, Tokenizer]:
    cfg = Gemma3Config.from_dir(DEMO_MODEL)
    backend = create_backend("cpu", cfg)
    backend.load_weights(Checkpoint.open(DEMO_MODEL, cfg).tensors())
    return backend, Tokenizer.from_dir(DEMO_MODEL)


def run_engine(backend: Backend, tokenizer: Tokenizer, requests: list[Request], max_batch: int = 8, budget: int = 512,
               seqs: int = 8, length: int = 256, ahead: int | None = None) -> tuple[dict[int, Completion], int]:
    """Completions by request id, and preemptions; the KV pool holds `seqs` sequences of `length`;
    `ahead`: Engine's schedule_ahead (None: its default)."""
    bs = 8
    blocks = {g.name: seqs * blocks_per_sequence(g, length, bs, budget) for g in backend.cfg.kv_groups()}
    engine = Engine(backend, KVPlan(bs, blocks, length, 0, 0, seqs), tokenizer, max_batch, budget, schedule_ahead=ahead)
    for r in requests:
        engine.add(r)
    out = {}
    while engine.num_unfinished:
        out.update((c.request_id, c) for c in engine.step())
    return out, engine.stats.preemptions
