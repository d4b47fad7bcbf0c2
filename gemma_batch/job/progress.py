"""Progress of a job: a tqdm bar on a terminal, plain periodic log lines otherwise (cron, pipes)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from tqdm import tqdm


def eta_text(seconds: float) -> str:
    """"HH:MM:SS", with days in front past 24 h ("3d 04:05:06"); "?" when unknown."""
    if not seconds < float("inf"):
        return "?"
    days, rest = divmod(int(round(seconds)), 86400)
    clock = f"{rest // 3600:02d}:{rest // 60 % 60:02d}:{rest % 60:02d}"
    return f"{days}d {clock}" if days else clock


class Progress:
    """Rows done out of `total` as they finish, rows and generated tokens per second, time left.

    On a terminal this is a tqdm bar; elsewhere one line every `interval_s` seconds on `stream`,
    e.g. `gemma-batch: 120/1000 rows (12.0%), 3.2 rows/s, 340.5 tok/s, prefix cache 87%, ETA 00:04:35`
    (the share of the finished rows' prompt tokens taken from the prefix cache). Rows finish
    in bursts (a batch's rows end together), so the time left is only estimated once this run has
    finished `settle` rows (the job's batch), from its rows per second since it started; "?" before.
    Rows that need no model time (kept, or already done) are counted apart from the rate.
    """

    def __init__(
        self, total: int, done: int = 0, stream: TextIO | None = None, interval_s: float = 30.0,
        tty: bool | None = None, settle: int = 1, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream or sys.stderr
        self.total, self.done, self.tokens = total, done, 0
        self.prompt_tokens = self.cached_prompt_tokens = 0
        self.interval_s, self.settle, self.clock = interval_s, settle, clock
        self.started = self._last_line = clock()
        self._free = done  # rows done without the model: earlier runs' and kept ones
        is_tty = self.stream.isatty() if tty is None else tty
        self._bar = tqdm(total=total, initial=done, unit="row", file=self.stream, dynamic_ncols=True,
                         bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} rows [{elapsed}{postfix}]") if is_tty else None

    def update(self, rows: int, tokens: int = 0, free: bool = False, prompt: tuple[int, int] = (0, 0)) -> None:
        """`rows` more finished with `tokens` generated; `free`: they took no model time; `prompt`:
        their prompt tokens, and how many of them came from the prefix cache."""
        self.done += rows
        self.tokens += tokens
        self.prompt_tokens += prompt[0]
        self.cached_prompt_tokens += prompt[1]
        if free:
            self._free += rows
        if self._bar is not None:
            self._bar.update(rows)
            self._bar.set_postfix_str(self._rates(), refresh=False)
        elif self.clock() - self._last_line >= self.interval_s:
            self._line()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        else:
            self._line()

    def row_rate(self) -> float:
        """Rows per second that needed the model, since this run started."""
        return (self.done - self._free) / max(self.clock() - self.started, 1e-9)

    def eta(self) -> str:
        left = self.total - self.done
        if left <= 0:
            return eta_text(0.0)
        if self.done - self._free < min(self.settle, self.total - self._free) or self.row_rate() <= 0:
            return "?"
        return eta_text(left / self.row_rate())

    def _token_rate(self) -> float:
        return self.tokens / max(self.clock() - self.started, 1e-9)

    def _rates(self) -> str:
        hits = f"prefix cache {100 * self.cached_prompt_tokens / self.prompt_tokens:.0f}%, " if self.prompt_tokens else ""
        return f"{self.row_rate():.2f} rows/s, {self._token_rate():.1f} tok/s, {hits}ETA {self.eta()}"

    def _line(self) -> None:
        self._last_line = self.clock()
        share = 100 * self.done / self.total if self.total else 100.0
        print(f"gemma-batch: {self.done}/{self.total} rows ({share:.1f}%), {self._rates()}", file=self.stream, flush=True)
