"""Where a process's start-up goes: named phases, each timed without the phases inside it, so
that the phases and what no phase covers add up to the whole.

A job records into a `Phases` (`with recording(phases):`, job/runner.py); any code it calls marks
its part with `with phase("weights: upload"):` (or `timed(items, name)` for a lazy reader), a
no-op where nothing records (the `LLM` API, tests) and on threads the recording did not start.
"""

from __future__ import annotations

import contextvars
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class Phases:
    """Seconds by phase name, in the order the phases first ran; a phase's time leaves out the
    phases opened inside it (those count as their own), and a name timed twice adds up."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._open: list[list[float]] = []  # per open phase: [its start, seconds of the phases inside it]

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.seconds.setdefault(name, 0.0)  # (in the order the phases opened)
        frame = [time.perf_counter(), 0.0]
        self._open.append(frame)
        try:
            yield
        finally:
            self._open.pop()
            elapsed = time.perf_counter() - frame[0]
            self.seconds[name] += elapsed - frame[1]
            if self._open:
                self._open[-1][1] += elapsed


_RECORDING: contextvars.ContextVar[Phases | None] = contextvars.ContextVar("gemma_batch_startup", default=None)


@contextmanager
def recording(phases: Phases) -> Iterator[Phases]:
    """Record the phases marked in this thread (`phase`, `timed`) into `phases` until the block ends."""
    token = _RECORDING.set(phases)
    try:
        yield phases
    finally:
        _RECORDING.reset(token)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as phase `name` of the recording in progress, if any."""
    phases = _RECORDING.get()
    if phases is None:
        yield
    else:
        with phases.phase(name):
            yield


def timed(items: Iterable[T], name: str) -> Iterator[T]:
    """`items`, the time spent making each one counted as phase `name` (a lazy reader)."""
    it = iter(items)
    while True:
        with phase(name):
            item = next(it, _END)
        if item is _END:
            return
        yield item


_END = object()


def phases_line(seconds: dict[str, float], total: float) -> str:
    """'start-up 3.1 s: imports 0.9, input 0.1, ..., other 0.2': phases of 0.05 s or more, in
    order, then what none covers."""
    other = total - sum(seconds.values())
    parts = [f"{name} {s:.1f}" for name, s in seconds.items() if s >= 0.05]
    parts += [f"other {other:.1f}"] if other >= 0.05 else []
    return f"start-up {total:.1f} s: {', '.join(parts) or 'nothing timed'}"


def process_seconds() -> float | None:
    """Seconds since this process started (Linux's /proc, to 0.01 s), or None where unknown."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def column(name: str) -> str:
    """A phase's name as a statistics column's part: 'weights: fp16 tiles' -> 'weights_fp16_tiles'."""
    return "_".join(name.replace(":", " ").lower().split())
