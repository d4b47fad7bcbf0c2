"""The step loop: requests in, completions out, one backend step at a time.

    engine = Engine(backend, plan, tokenizer)
    engine.add(Request(...))
    while engine.num_unfinished:
        for completion in engine.step(): ...

Each step the scheduler picks sequences and token counts, the step builder flattens them, the
backend runs and samples, and each sampled token is appended, detokenized and checked against
the request's stop token ids, stop strings and length limit.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import deque
from collections.abc import Callable

from ..backends.base import Backend, StepBatch, StepResult
from ..model.detokenizer import IncrementalDetokenizer
from ..model.tokenizer import Tokenizer
from ..startup import phase
from ..switches import switched_on
from .choices import ChoiceScores
from .constraints import step_masks
from .kv_cache import KVCacheManager
from .kv_plan import KVPlan
from .read_back import read_back
from .request import Completion, NonFiniteLogits, Request
from .scheduler import Scheduler
from .sequence import Sequence
from .stats import EngineStats
from .token_logprobs import token_logprobs
from .step_builder import build_sampling, build_step
from .step_records import LiveRequest, SubmittedStep, non_finite

StepHook = Callable[[list[int], StepBatch, StepResult], None]
AHEAD_ENV = "GEMMA_BATCH_SCHEDULE_AHEAD"  # steps submitted ahead: "0" schedules each after the last finished
DEFAULT_AHEAD = 2  # where the backend holds as many more in flight: the host may take up to ~2 steps' device time
SMALL_STEPS_ENV = "GEMMA_BATCH_SMALL_STEPS"  # "0": steps beside a full batch may take the whole budget (Scheduler)


class Engine:
    def __init__(
        self,
        backend: Backend,
        plan: KVPlan,
        tokenizer: Tokenizer | None = None,
        max_batch: int = 32,
        step_token_budget: int = 512,
        on_step: StepHook | None = None,
        schedule_ahead: int | None = None,
        prefix_cache: bool = True,
    ) -> None:
        """`tokenizer` is needed for text and stop strings; without it completions carry ids only.
        `step_token_budget`: the most tokens a step takes, lowered to what the backend can hold
        (`Backend.max_step_tokens`; `scheduler.step_token_budget` is the one in force).
        `on_step` sees each step's request ids, batch and result (and asks for all logits).
        `schedule_ahead`: how many steps are scheduled and submitted ahead of the one being
        waited for (0: one step at a time; default: DEFAULT_AHEAD where the backend overlaps,
        without `on_step`, or GEMMA_BATCH_SCHEDULE_AHEAD; never more than the backend holds in
        flight besides the one waited for); the completions are the same either way.
        `prefix_cache`: a prompt starts from the K/V of the longest cached run of its blocks
        (`KVCacheManager`); the completions are the same either way."""
        self.backend = backend
        self.tokenizer = tokenizer
        self.groups = backend.cfg.kv_groups()
        self.block_size = plan.block_size
        seed = hashlib.blake2b(repr((backend.identity, backend.cfg)).encode(), digest_size=16).digest()
        self.kv = KVCacheManager(self.groups, plan.num_blocks, plan.block_size, seed if prefix_cache else None)
        self.stats = EngineStats()
        self.on_step = on_step
        self._live: dict[int, LiveRequest] = {}
        self._constrained = 0  # live requests with a grammar
        self._scores: dict[int, ChoiceScores] = {}  # by sequence id: the rows answered by scoring choices
        # Never ahead with an `on_step` hook, which needs each step's results before the next is scheduled.
        if schedule_ahead and on_step is not None:
            raise ValueError("an on_step hook needs each step's results before the next is scheduled")
        if schedule_ahead is None:
            wanted = os.environ.get(AHEAD_ENV, "").strip() or str(DEFAULT_AHEAD)  # unset or empty: the default
            if not wanted.isdigit():
                raise ValueError(f"{AHEAD_ENV}={wanted!r}: expected the number of steps to submit ahead (0, 1, 2)")
            schedule_ahead = int(wanted) if backend.overlaps and on_step is None else 0
        if not 0 <= schedule_ahead < backend.MAX_IN_FLIGHT:
            raise ValueError(f"{schedule_ahead} steps ahead: the {backend.name} backend holds at most "
                             f"{backend.MAX_IN_FLIGHT - 1} besides the one waited for")
        self.schedule_ahead = schedule_ahead
        self._in_flight: deque[SubmittedStep] = deque()  # submitted ahead by earlier `step`s, not waited for
        with phase("KV cache"):
            backend.allocate_kv(plan.num_blocks, plan.block_size)
        widths = {g.name: -(-plan.max_model_len // plan.block_size) for g in self.groups}  # tables span every position
        # A step the device cannot hold is never planned: the budget stays within the backend's limit.
        limit = backend.max_step_tokens(max_batch, widths)
        if limit is not None:
            step_token_budget = max(max_batch, min(step_token_budget, limit))
        small_step = backend.small_step if switched_on(SMALL_STEPS_ENV) else None
        self.scheduler = Scheduler(self.kv, max_batch, step_token_budget, small_step)
        with phase("step buffers and recording"):
            backend.reserve(step_token_budget, max_batch, widths)

    @property
    def num_unfinished(self) -> int:
        """Requests added and not yet returned (some may only wait for a step in flight)."""
        return len(self._live)

    def add(self, request: Request) -> None:
        if request.request_id in self._live:
            raise ValueError(f"request {request.request_id} is already in the engine")
        seq = Sequence.from_prompt(request.request_id, request.prompt_ids, request.max_new, request.stop_token_ids)
        if request.choices is not None:
            scores = self._scores[seq.seq_id] = ChoiceScores(request.choices, seq.num_prompt_tokens)
            if scores.first_choice():
                seq.token_ids += scores.tokens_after_prompt()
        needs_text = self.tokenizer is not None
        if (request.params.stop or request.params.logprobs is not None) and not needs_text:
            raise ValueError("stop strings and logprobs need an engine with a tokenizer")
        self._live[seq.seq_id] = LiveRequest(request, IncrementalDetokenizer(self.tokenizer) if needs_text else None)
        self._constrained += request.matcher is not None
        self.scheduler.add(seq)

    def step(self) -> list[Completion]:
        """Run one step; return the requests it finished.

        With `schedule_ahead` = n, the n steps after this one are scheduled, built and submitted
        before it is waited for, so the device goes from one step to the next without waiting for
        the host, even when the host's work on a step takes up to about n steps' device time
        (a host stall): each token a step is sampling is fed to the next one on the device
        (`StepBatch.token_sources`), and a sequence that stops here on a token or a string still
        has its rows in the steps ahead, whose results for it are dropped (their K/V went to
        blocks it no longer holds; whoever gets them next writes every slot before reading it)."""
        started = time.perf_counter()
        if not self._in_flight:
            scheduled = self.scheduler.schedule()
            if not scheduled:
                raise RuntimeError(f"scheduler made no progress with {self.num_unfinished} unfinished requests")
            self._in_flight.append(self._submit(scheduled, started))
        # A constrained sequence's next mask needs its last token: no steps ahead while one runs.
        while (len(self._in_flight) <= self.schedule_ahead and not self._constrained
               and (ahead := self._submit_ahead(self._in_flight[-1], started))):
            self._in_flight.append(ahead)
        current = self._in_flight.popleft()
        result = self.backend.wait()
        self._check_finite(current, result)
        if self.on_step is not None:
            self.on_step([seq.seq_id for seq, _ in current.scheduled], current.batch, result)

        done, sampled = self._scored(current, result), 0
        for s, seq, first in current.sampled:
            if seq.finished or seq.seq_id in self._scores:  # stopped in a step before (still running when this
                continue  # one was submitted), or scoring its choices
            if first:
                self.stats.record_ttft(time.perf_counter() - self._live[seq.seq_id].admitted_at)
            if s in current.reads.logprob_rows:
                self._log_token(seq, current, s, result)
            self._append(seq, int(result.token_ids[s]))
            sampled += 1
            if seq.finished:
                done.append(self._finish(seq))
        if all(seq.finished for ahead in self._in_flight for seq, _ in ahead.scheduled):
            for _ in self._in_flight:  # every sequence of the steps ahead has stopped: nothing to take from them
                self.backend.discard()
            self._in_flight.clear()
        self._record(current, sampled, started)
        return done

    def _submit(self, scheduled: list[tuple[Sequence, int]], started: float,
                previous: SubmittedStep | None = None) -> SubmittedStep:
        """Build and submit a step (`previous`: the step still running before it), and count its
        tokens as cached."""
        batch = self._build(scheduled, [seq for seq, _ in previous.scheduled] if previous is not None else None)
        for seq, _ in scheduled:
            live = self._live[seq.seq_id]
            live.admitted_at = live.admitted_at or started
        requests = [self._live[seq.seq_id].request for seq, _ in scheduled]
        batch.sampling = build_sampling(scheduled, requests, batch.sample, self.tokenizer.vocab_size if self.tokenizer else 0)
        reads = read_back(scheduled, batch, [self._scores.get(seq.seq_id) for seq, _ in scheduled],
                          [r.params.logprobs is not None for r in requests])
        batch.score_tokens, batch.score_ids, batch.logit_rows = reads.score_tokens, reads.score_ids, reads.logit_rows
        self.backend.submit(batch)
        if batch.sampling.masks_follow:  # computed while the device runs the step
            self.backend.allow(step_masks([r.matcher for r in requests], batch.sample, self.backend.cfg.vocab_size))
        sampled, prefill_tokens = [], 0
        for s, (seq, n) in enumerate(scheduled):
            decode = n == 1 and seq.num_completion_tokens > 0 and seq.num_cached_tokens == seq.num_tokens - 1
            prefill_tokens += 0 if decode else n
            self.stats.prompt_tokens_computed += n if seq.feeds_prompt else 0
            seq.num_cached_tokens += n
            self.kv.register(seq)  # (before sliding blocks leave: a later prompt may start there)
            scores = self._scores.get(seq.seq_id)  # (every choice's queries start at the prompt's end)
            self.kv.release_out_of_window(seq, scores.prompt_len if scores else None)
            if batch.sample[s]:
                sampled.append((s, seq, seq.num_completion_tokens == 0))
        return SubmittedStep(scheduled, batch, sampled, prefill_tokens, reads)

    def _submit_ahead(self, current: SubmittedStep, started: float) -> SubmittedStep | None:
        """The step after `current` (the last submitted), submitted while it runs: each sequence
        `current` samples holds the place of its coming token, and those that reach their length
        limit with it leave the batch now. A scored sequence (choices) holds no place: the host
        decides what it feeds next once its scores are in, and until then it is not preempted."""
        if not current.held:  # (held already when the last call scheduled nothing after it)
            for _, seq, _ in current.sampled:
                if seq.finished or seq.seq_id in self._scores:  # stopped in a step before `current`; scored
                    continue
                seq.append_pending()
                if seq.at_length_limit:
                    self.scheduler.finish(seq)
            current.held = True
        scoring = {seq.seq_id for step in self._in_flight for seq, _ in step.scheduled if seq.seq_id in self._scores}
        scheduled = self.scheduler.schedule(pinned=scoring)
        return self._submit(scheduled, started, current) if scheduled else None

    def _check_finite(self, step: SubmittedStep, result: StepResult) -> None:
        """NonFiniteLogits, before anything of the step is taken, where a live sequence's logits
        were not finite (`non_finite`)."""
        bad = sorted(self._live[i].request.request_id for i in non_finite(step, result) if i in self._live)
        if bad:
            raise NonFiniteLogits(bad)

    def _scored(self, step: SubmittedStep, result: StepResult) -> list[Completion]:
        """Take a step's scores into the scorings of their sequences; a sequence whose choice is
        all fed (by this step: none ahead holds it) moves to the next one (back to its prompt), or,
        after the last, finishes."""
        for first, n, seq, position in step.reads.scored:
            self._scores[seq.seq_id].record(position, result.scores[first: first + n])
        if not step.reads.scored:
            return []
        done, ahead = [], {seq.seq_id for later in self._in_flight for seq, _ in later.scheduled}
        for seq in dict.fromkeys(seq for _, _, seq, _ in step.reads.scored):
            if seq.num_cached_tokens < seq.num_tokens or seq.seq_id in ahead:
                continue
            scores, request = self._scores[seq.seq_id], self._live[seq.seq_id].request
            if scores.rewind(seq):
                continue
            pick, scored = scores.result(request.params.temperature, request.rng_key)
            seq.token_ids[seq.num_prompt_tokens:] = request.choices.token_ids[pick]
            seq.end()
            done.append(self._finish(seq, request.choices.texts[pick], scored))
        return done

    def _log_token(self, seq: Sequence, step: SubmittedStep, s: int, result: StepResult) -> None:
        """Record the log-probabilities of the token sequence `s` of `step` drew."""
        live, allowed = self._live[seq.seq_id], step.batch.sampling.allowed
        entry = token_logprobs(result.row_logits[step.reads.logprob_rows[s]], int(result.token_ids[s]),
                               live.request.params.logprobs, self.tokenizer, None if allowed is None else allowed[s])
        live.logprobs = live.logprobs if live.logprobs is not None else []
        live.logprobs.append(entry)

    def _build(self, scheduled: list[tuple[Sequence, int]], previous: list[Sequence] | None) -> StepBatch:
        return build_step(scheduled, [g.name for g in self.groups], self.block_size,
                          return_logits=self.on_step is not None, previous=previous)

    def _append(self, seq: Sequence, token: int) -> None:
        """Add a sampled token (in the place `_submit_ahead` held for it, if any); end the
        sequence at a stop string (cut from the text)."""
        if seq.num_pending:
            seq.resolve(token)
        else:
            seq.append(token)
        live = self._live[seq.seq_id]
        if token in seq.stop_token_ids:
            return
        if live.request.matcher is not None:
            live.request.matcher.accept(token)
            if live.request.matcher.done:  # nothing can follow: the completion ends here, whole
                seq.end()
        if live.add_text(token):
            seq.end()

    def _finish(self, seq: Sequence, choice: str | None = None, choice_logprobs: list[dict] | None = None) -> Completion:
        """The completion of a finished sequence (`choice`: the answer of a scored one)."""
        self.scheduler.finish(seq)  # (nothing to do if it left when its last token was scheduled)
        live = self._live.pop(seq.seq_id)
        matcher = live.request.matcher
        self._constrained -= matcher is not None
        self.stats.record_prompt(seq.num_prompt_tokens, seq.num_prompt_tokens_hit)
        if choice is not None:
            del self._scores[seq.seq_id]
            return Completion(seq.seq_id, seq.completion_ids, choice, "stop", seq.num_prompt_tokens, choice_logprobs,
                              cached_prompt_tokens=seq.num_prompt_tokens_hit)
        if live.detok is not None and not live.stopped_by_string:
            live.text += live.detok.flush()
        stopped = live.stopped_by_string or seq.token_ids[-1] in seq.stop_token_ids or (matcher is not None and matcher.done)
        return Completion(seq.seq_id, seq.completion_ids, live.text, "stop" if stopped else "length",
                          seq.num_prompt_tokens, logprobs=live.logprobs, cached_prompt_tokens=seq.num_prompt_tokens_hit)

    def _record(self, step: SubmittedStep, sampled: int, started: float) -> None:
        stats = self.stats
        stats.record_step(time.perf_counter() - started, step.prefill_tokens, sampled)
        stats.batch_size_sum += len(step.scheduled)
        stats.preemptions = self.scheduler.preemptions
        stats.record_blocks({name: pool.num_blocks - pool.num_free for name, pool in self.kv.pools.items()})
        stats.prefix_evictions = sum(pool.evictions for pool in self.kv.pools.values())
