"""The AMD XDNA NPU through XRT: whether one is here, and why not. No backend runs on it yet
(npu/README.md says what an NPU stage needs); `gemma-batch devices` reports what this finds."""

from __future__ import annotations

import glob


def find_npus() -> tuple[list[str], str | None]:
    """The names of the XRT devices that open, and why there are none (or why one did not open)."""
    try:
        import pyxrt  # XRT's Python binding, installed with XRT
    except ImportError:
        return [], "pyxrt (XRT's Python binding) does not import: XRT is not installed"
    nodes = sorted(glob.glob("/dev/accel/accel*"))
    if not nodes:
        return [], "no /dev/accel device: the amdxdna driver is not loaded, or there is no NPU"
    names: list[str] = []
    for index in range(len(nodes)):
        try:
            names.append(str(pyxrt.device(index).get_info(pyxrt.xrt_info_device.name)))
        except Exception as e:  # pyxrt raises RuntimeError (and others) from the driver
            return names, f"XRT cannot open device {index} ({nodes[index]}): {e}"
    return names, None
