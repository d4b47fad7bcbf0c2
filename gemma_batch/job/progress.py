"""Progress of a job: a tqdm bar on a terminal, plain periodic log lines otherwise (cron, pipes)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm


class Progress:
    """Rows done out of `total`, generated tokens per second and the time left.

    On a terminal this is a tqdm bar; elsewhere one line every `interval_s` seconds on `stream`,
    e.g. `gemma-batch: 120/1000 rows (12.0%), 340.5 tok/s, ETA 0:02:10`.
    """

    def __init__(
        self, total: int, done: int = 0, stream: TextIO | None = None, interval_s: float = 30.0, tty: bool | None = None
    ) -> None:
        self.stream = stream or sys.stderr
        self.total, self.done, self.tokens = total, done, 0
        self.interval_s = interval_s
        self.started = self._last_line = time.monotonic()
        self._start_done = done
        is_tty = self.stream.isatty() if tty is None else tty
        self._bar = tqdm(total=total, initial=done, unit="row", file=self.stream, dynamic_ncols=True) if is_tty else None

    def update(self, rows: int, tokens: int = 0) -> None:
        self.done += rows
        self.tokens += tokens
        if self._bar is not None:
            self._bar.update(rows)
            self._bar.set_postfix_str(f"{self._rate():.1f} tok/s", refresh=False)
        elif time.monotonic() - self._last_line >= self.interval_s:
            self._line()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        else:
            self._line()

    def _rate(self) -> float:
        return self.tokens / max(time.monotonic() - self.started, 1e-9)

    def _line(self) -> None:
        self._last_line = now = time.monotonic()
        rows_per_s = (self.done - self._start_done) / max(now - self.started, 1e-9)
        left = (self.total - self.done) / rows_per_s if rows_per_s > 0 else float("inf")
        eta = time.strftime("%H:%M:%S", time.gmtime(left)) if left != float("inf") else "?"
        share = 100 * self.done / self.total if self.total else 100.0
        print(
            f"gemma-batch: {self.done}/{self.total} rows ({share:.1f}%), {self._rate():.1f} tok/s, ETA {eta}",
            file=self.stream, flush=True,
        )
