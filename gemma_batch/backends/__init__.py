"""Backends run Gemma 3 steps on a device; `base.py` holds the contract."""

from __future__ import annotations

from ..model.config import Gemma3Config
from .base import Backend

BACKENDS = ("cpu",)


def create_backend(name: str, cfg: Gemma3Config) -> Backend:
    """A backend by name (only the numpy CPU backend exists yet)."""
    if name == "cpu":
        from .cpu import CpuBackend

        return CpuBackend(cfg)
    raise ValueError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
