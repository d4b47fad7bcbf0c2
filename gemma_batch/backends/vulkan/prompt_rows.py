"""Which kernels a step's prompt tokens take (StepBatch.prompt_lens): their attention on the flash
kernel (flash.py) and their products on the prompt tile (coop_tiles), each where the backend runs
it; and what the step's grids and inputs need to know of that."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...model.config import Gemma3Config
from ..base import StepBatch
from . import flash


@dataclass(frozen=True)
class PromptRows:
    start: int | None  # the first token on the prompt tile (None: none)
    flash: np.ndarray | None  # [T] bool, the tokens on attention_flash.comp (None: none)
    tiles: np.ndarray | None  # their tiles (flash.step_tiles)
    scalar_positions: np.ndarray  # the positions of the tokens attention.comp serves


def prompt_rows(batch: StepBatch, cfg: Gemma3Config, on_flash: bool, prompt_tile: bool) -> PromptRows:
    """The step's prompt rows, with the flash kernel (`on_flash`) and the prompt tile on or off."""
    prompt = batch.prompt_mask()
    has = bool(prompt.any())
    start = batch.prompt_start(prompt) if prompt_tile and has else None
    if not (on_flash and has):
        return PromptRows(start, None, None, batch.positions)
    return PromptRows(start, prompt, flash.step_tiles(batch, cfg, prompt), batch.positions[~prompt])
