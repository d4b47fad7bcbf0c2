"""pending.jsonl: the append-only journal of a job's committed rows that are not yet in a part.

One JSON line per row (`codec.RowCodec`), appended with one os.write, so a row survives SIGKILL
as soon as `append` returns; fsync at most once every SYNC_INTERVAL_S (`sync_if_due`) and on
every `rewrite`. A last line torn by a kill (no newline) is cut off by `read`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..data import writers
from .codec import journal_line_index

SYNC_INTERVAL_S = 1.0


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._synced_at = 0.0

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def read(self) -> Iterator[tuple[int, bytes]]:
        """(row index, line) of every whole line in order; the file is truncated after the
        last whole line (a line torn by a kill)."""
        good = 0
        with open(self.path, "rb") as f:
            for line in f:
                index = journal_line_index(line)
                if index is None:  # torn by a kill: cut here
                    break
                good += len(line)
                yield index, line
        if good < self.path.stat().st_size:
            os.truncate(self.path, good)

    def open(self) -> None:
        """Open for appending (creating the file if needed)."""
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._synced_at = time.monotonic()

    def append(self, line: bytes) -> None:
        view = memoryview(line)
        while view:
            view = view[os.write(self._fd, view):]

    def sync_if_due(self) -> None:
        if time.monotonic() - self._synced_at >= SYNC_INTERVAL_S:
            os.fsync(self._fd)
            self._synced_at = time.monotonic()

    def rewrite(self, lines: Iterable[bytes]) -> None:
        """Replace the journal with `lines`, atomically (tmp, fsync, rename), and reopen it."""
        self.close()
        with writers.atomic_file(self.path) as f:
            f.writelines(lines)
        self.open()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
