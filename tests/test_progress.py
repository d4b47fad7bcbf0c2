"""Progress reporting: a tqdm bar on a terminal, periodic plain lines elsewhere."""

from __future__ import annotations

import io

from gemma_batch.job.progress import Progress


def test_off_a_terminal_progress_is_plain_periodic_lines():
    stream = io.StringIO()
    progress = Progress(total=10, done=2, stream=stream, interval_s=0.0, tty=False)
    progress.update(3, tokens=30)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("gemma-batch: 5/10 rows (50.0%), ") and "tok/s, ETA " in lines[0]
    assert lines[-1].startswith("gemma-batch: 5/10 rows") and "\r" not in stream.getvalue()


def test_lines_are_rate_limited():
    stream = io.StringIO()
    progress = Progress(total=100, stream=stream, interval_s=3600.0, tty=False)
    for _ in range(50):
        progress.update(1, tokens=4)
    assert stream.getvalue() == ""  # nothing until the interval passes (or close)
    progress.close()
    assert stream.getvalue().count("\n") == 1 and "50/100 rows" in stream.getvalue()


def test_on_a_terminal_progress_is_a_tqdm_bar_with_tokens_per_second():
    stream = io.StringIO()
    progress = Progress(total=4, stream=stream, tty=True)
    progress.update(4, tokens=100)
    progress.close()
    text = stream.getvalue()
    assert "4/4" in text and "tok/s" in text and "\r" in text
