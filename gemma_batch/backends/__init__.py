"""Backends run Gemma 3 steps on a device; `base.py` holds the contract."""

from __future__ import annotations

from ..model.config import Gemma3Config
from .base import Backend

BACKENDS = ("cpu",)


def resolve_backend(name: str) -> tuple[str, str]:
    """The backend `name` stands for ("auto" picks one), and why, for the job's log."""
    if name == "auto":
        return "cpu", "auto: cpu is the only backend in this build"
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; available: auto, {', '.join(BACKENDS)}")
    return name, "chosen with --backend"


def create_backend(name: str, cfg: Gemma3Config) -> Backend:
    """A backend by name (only the numpy CPU backend exists yet)."""
    if name == "cpu":
        from .cpu import CpuBackend

        return CpuBackend(cfg)
    raise ValueError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
