"""Uploads through the staging buffer, filled on several threads (memory.COPY_THREADS_ENV), land
byte for byte, across staging pieces and at an offset; on llvmpipe in CI."""

from __future__ import annotations

import numpy as np
import pytest

from gemma_batch.backends.vulkan.device import Device
from gemma_batch.backends.vulkan.memory import COPY_THREADS_ENV, SPLIT_BYTES, STAGING_BYTES, Memory


@pytest.mark.parametrize("threads", ["1", "3"])
def test_an_upload_lands_byte_for_byte(monkeypatch, threads):
    monkeypatch.setenv(COPY_THREADS_ENV, threads)
    data = np.random.default_rng(0).integers(0, 256, STAGING_BYTES + SPLIT_BYTES + 7, dtype=np.uint8)
    device = Device()
    mem = Memory(device)
    try:
        buf = mem.alloc(data.nbytes + 64, "target")
        mem.upload(buf, data, offset=64)
        got = mem.download(buf, data.nbytes, offset=64)
        assert np.array_equal(got, data)
        mem.upload(buf, data[:1000])  # (small: not split)
        assert np.array_equal(mem.download(buf, 1000), data[:1000])
    finally:
        mem.close()
        device.close()
