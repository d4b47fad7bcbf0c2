"""The start-up's phases (gemma_batch/startup.py): exclusive times that add up, a lazy reader
timed, nothing recorded outside a recording; the weights read ahead on a thread (model/read_ahead.py)."""

from __future__ import annotations

import time

import pytest

from gemma_batch.model.read_ahead import read_ahead
from gemma_batch.startup import Phases, column, phase, phases_line, process_seconds, recording, timed


def test_a_phase_inside_another_counts_only_once():
    phases = Phases()
    started = time.perf_counter()
    with recording(phases):
        with phase("outer"):
            time.sleep(0.02)
            with phase("inner"):
                time.sleep(0.05)
            with phase("inner"):  # a name timed twice adds up
                time.sleep(0.01)
    total = time.perf_counter() - started
    assert list(phases.seconds) == ["outer", "inner"]
    assert 0.06 <= phases.seconds["inner"] < 0.06 + 0.03
    assert 0.02 <= phases.seconds["outer"] < 0.02 + 0.03  # without the inner phases' time
    assert sum(phases.seconds.values()) <= total


def test_a_lazy_reader_counts_its_making_not_its_use():
    def slow():
        for i in range(3):
            time.sleep(0.02)
            yield i

    phases = Phases()
    with recording(phases), phase("use"):
        got = []
        for item in timed(slow(), "read"):
            time.sleep(0.01)
            got.append(item)
    assert got == [0, 1, 2]
    assert 0.06 <= phases.seconds["read"] < 0.06 + 0.03 and 0.03 <= phases.seconds["use"] < 0.03 + 0.03


def test_nothing_is_recorded_outside_a_recording():
    phases = Phases()
    with phase("anything"):
        pass
    with recording(phases):
        pass
    with phase("after"):
        pass
    assert phases.seconds == {}


def test_the_line_and_the_columns():
    assert phases_line({"imports": 0.91, "tiny": 0.01, "KV cache": 0.5}, 2.0) == "start-up 2.0 s: imports 0.9, KV cache 0.5, other 0.6"
    assert column("weights: fp16 tiles") == "weights_fp16_tiles" and column("KV cache") == "kv_cache"
    age = process_seconds()
    assert age is None or 0 < age < 3600  # (this test process started less than an hour ago)


def test_reading_ahead_gives_every_item_in_order_and_stops_with_its_consumer():
    made = []

    def items():
        for i in range(50):
            made.append(i)
            yield i

    assert list(read_ahead(items())) == list(range(50))
    made.clear()
    reader = read_ahead(items(), depth=1)
    assert [next(reader) for _ in range(3)] == [0, 1, 2]
    reader.close()  # the thread stops: at most depth + 1 items were made past the consumer's
    assert len(made) <= 5 and list(reader) == []
    made.clear()
    started = read_ahead(items(), depth=2)
    time.sleep(0.2)  # nothing asked for yet: the thread has made what its depth allows
    assert made == [0, 1, 2]
    started.close()


def test_an_error_while_reading_ahead_comes_where_its_item_would_have():
    def items():
        yield 1
        raise OSError("disk gone")

    reader = read_ahead(items())
    assert next(reader) == 1
    with pytest.raises(OSError, match="disk gone"):
        next(reader)
