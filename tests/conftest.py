"""Test-wide: the Vulkan backends a test module made are closed when the module ends.

Many tests make a `VulkanBackend` and leave it open. On llvmpipe its device memory is the
process's own, so one pytest process held 14 GB by the end of test_vulkan_backend.py, and a full
run was once killed for memory (24 GB machine). Closing each module's backends when the module
ends (its module-scoped fixtures are done with them by then) bounds that to one module's worth.
"""

from __future__ import annotations

import pytest

from gemma_batch.backends.vulkan.backend import VulkanBackend

_made: list[VulkanBackend] = []
_init = VulkanBackend.__init__


def _recorded_init(self: VulkanBackend, *args, **kwargs) -> None:
    _init(self, *args, **kwargs)
    _made.append(self)


VulkanBackend.__init__ = _recorded_init


@pytest.fixture(scope="module", autouse=True)
def _close_the_modules_vulkan_backends():
    yield
    while _made:
        _made.pop().close()
