"""Stopping a job cleanly on SIGTERM or SIGINT (cron and systemd time-outs, Ctrl-C).

The first signal asks the job to stop at the next step boundary: the rows finished by then are
committed (each commit is durable already, `store.py`), the output stays partial, and a rerun of
the same command resumes. The job then ends with `JobStopped`, which the command line turns into
exit code 128 + the signal's number (143 for SIGTERM, 130 for SIGINT), the shell's convention.
A second signal exits at once with that code, as `kill -9` would leave things (the store
survives that too).
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class JobStopped(Exception):
    """The job stopped on a signal after committing its finished rows."""

    def __init__(self, signum: int, rows_done: int) -> None:
        self.signum, self.rows_done = signum, rows_done
        super().__init__(f"stopped by {signal.Signals(signum).name}: {rows_done} row(s) finished this run are saved; "
                         "run the same command again to resume")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopOnSignal:
    """Within the `with`: SIGTERM and SIGINT set `signum` instead of ending the process; a second
    one exits at once. Outside the main thread (where Python cannot install handlers) it does
    nothing."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            os._exit(128 + signum)
        self.signum = signum

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
