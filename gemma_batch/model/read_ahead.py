"""A reader on a thread ahead of its consumer, from the moment it is made: the next tensor is read
from disk (and converted, for a quantized format) while the backend uploads this one; a job's
rows are tokenized while the weights load."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")
_END = object()


class ReadAhead(Iterator[T], Generic[T]):
    """`items`, each made on a thread as soon as fewer than `depth` wait for the consumer (so at
    most depth + 2 are alive at once: those waiting, the one the thread holds, the consumer's).
    An error of `items` is raised where its item would have come; `close` stops the thread (call
    it when not reading to the end)."""

    def __init__(self, items: Iterable[T], depth: int = 1) -> None:
        self._ready: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._produce, args=(items,), name="read ahead", daemon=True)
        self._thread.start()

    def _put(self, entry: tuple[object, BaseException | None]) -> bool:
        while not self._stop.is_set():
            try:
                self._ready.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self, items: Iterable[T]) -> None:
        try:
            for item in items:
                if not self._put((item, None)):
                    return
            self._put((_END, None))
        except BaseException as e:  # noqa: BLE001 (raised in the consumer's thread)
            self._put((_END, e))

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        item, error = self._ready.get()
        if item is _END:
            self.close()
            if error is not None:
                raise error
            raise StopIteration
        return item

    def close(self) -> None:
        self._done = True
        self._stop.set()
        self._thread.join()


def read_ahead(items: Iterable[T], depth: int = 1) -> ReadAhead[T]:
    """`items` read on a thread, starting now (`ReadAhead`)."""
    return ReadAhead(items, depth)
