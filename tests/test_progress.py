"""Progress reporting: a tqdm bar on a terminal, periodic plain lines elsewhere; rates and an ETA
that reads right."""

from __future__ import annotations

import io
import re

from gemma_batch.job.progress import Progress, eta_text


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_off_a_terminal_progress_is_plain_periodic_lines():
    stream, clock = io.StringIO(), Clock()
    progress = Progress(total=10, done=2, stream=stream, interval_s=0.0, tty=False, clock=clock)
    clock.now += 2.0
    progress.update(4, tokens=30)
    progress.close()
    lines = stream.getvalue().splitlines()
    # 4 rows in 2 s (the 2 done before this run are not in the rate): 2 rows/s, 4 left
    assert lines[0] == "gemma-batch: 6/10 rows (60.0%), 2.00 rows/s, 15.0 tok/s, ETA 00:00:02"
    assert lines[-1].startswith("gemma-batch: 6/10 rows") and "\r" not in stream.getvalue()


def test_the_line_gives_the_prefix_cache_hit_rate_of_the_finished_rows():
    stream, clock = io.StringIO(), Clock()
    progress = Progress(total=10, stream=stream, interval_s=0.0, tty=False, clock=clock)
    clock.now += 1.0
    progress.update(1, tokens=4, prompt=(1000, 0))
    progress.update(3, tokens=12, prompt=(3000, 2880))
    assert stream.getvalue().splitlines()[-1] == "gemma-batch: 4/10 rows (40.0%), 4.00 rows/s, 16.0 tok/s, prefix cache 72%, ETA 00:00:02"


def test_no_eta_until_a_batch_of_rows_finished_and_kept_rows_are_not_in_the_rate():
    stream, clock = io.StringIO(), Clock()
    progress = Progress(total=1000, stream=stream, interval_s=0.0, tty=False, settle=32, clock=clock)
    progress.update(500, free=True)  # kept from an earlier run: no model time
    clock.now += 1.0
    progress.update(1, tokens=8)  # one row of the first batch: no estimate yet
    assert progress.eta() == "?"
    clock.now += 31.0
    progress.update(31, tokens=248)
    assert progress.row_rate() == 1.0 and progress.eta() == eta_text(468.0) == "00:07:48"


def test_eta_past_a_day_shows_days():
    assert eta_text(3 * 86400 + 4 * 3600 + 5 * 60 + 6) == "3d 04:05:06"
    assert eta_text(59.6) == "00:01:00" and eta_text(float("inf")) == "?"


def test_lines_are_rate_limited():
    stream = io.StringIO()
    progress = Progress(total=100, stream=stream, interval_s=3600.0, tty=False)
    for _ in range(50):
        progress.update(1, tokens=4)
    assert stream.getvalue() == ""  # nothing until the interval passes (or close)
    progress.close()
    assert stream.getvalue().count("\n") == 1 and "50/100 rows" in stream.getvalue()


def test_on_a_terminal_progress_is_a_tqdm_bar_with_rows_and_tokens_per_second():
    stream = io.StringIO()
    progress = Progress(total=4, stream=stream, tty=True)
    progress.update(4, tokens=100)
    progress.close()
    text = stream.getvalue()
    assert "4/4 rows" in text and "rows/s" in text and "tok/s" in text and "ETA" in text and "\r" in text


def test_the_bar_has_no_empty_item_before_its_rates():
    """The bar read `[00:02, , 6.91 rows/s` (tqdm puts its own comma before the postfix)."""
    stream = io.StringIO()
    progress = Progress(total=4, stream=stream, tty=True)
    progress.update(1, tokens=10)
    progress.close()
    text = stream.getvalue()
    assert ", ," not in text and re.search(r"rows \[\d\d:\d\d, [\d.]+ rows/s", text), text
