"""One writer per output: an exclusive `flock` on "<output>.lock".

The lock file is created if missing and never deleted: deleting it would let a second run lock a
fresh inode while the first still holds the old one. The holder writes its pid into the file so
that a refused run can say who holds the lock. `flock` locks belong to the open file description,
so the lock is released when the holder exits or is killed, however it dies.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType


class JobLocked(Exception):
    """Another process holds the lock of this output."""


class OutputLock:
    """Context manager holding the exclusive lock of `output` (non-blocking: refuses at once)."""

    def __init__(self, output: Path) -> None:
        self.output = Path(output)
        self.path = self.output.with_name(self.output.name + ".lock")
        self._fd: int | None = None

    def __enter__(self) -> OutputLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise JobLocked(
                f"another gemma-batch run (pid {holder}) is writing {self.output}"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None
