"""A reader on a thread one item ahead of its consumer: the next tensor is read from disk (and
converted, for a quantized format) while the backend uploads this one."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
_END = object()


def read_ahead(items: Iterable[T], depth: int = 1) -> Iterator[T]:
    """`items`, each made on a thread while the consumer still holds up to `depth` before it (so at
    most depth + 1 are alive at once). An error of `items` is raised where its item would have
    come; closing this generator stops the thread."""
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry: tuple[object, BaseException | None]) -> bool:
        while not stop.is_set():
            try:
                ready.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
            put((_END, None))
        except BaseException as e:  # noqa: BLE001 (raised in the consumer's thread)
            put((_END, e))

    thread = threading.Thread(target=produce, name="read ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, error = ready.get()
            if error is not None:
                raise error
            if item is _END:
                return
            yield item
            del item  # (the consumer's reference is the only one left)
    finally:
        stop.set()
        thread.join()
