"""On/off environment switches (every fast path can be turned off: GEMMA_BATCH_*=0)."""

from __future__ import annotations

import os

OFF = ("0", "off", "false", "no")


def switched_on(name: str, default: bool = True) -> bool:
    """Environment variable `name` as a switch: unset or empty gives `default`; "0", "off",
    "false" or "no" (any case) turn it off; anything else on."""
    value = os.environ.get(name, "").strip().lower()
    return default if not value else value not in OFF
