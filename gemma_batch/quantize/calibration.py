"""The calibration pass behind int4's rounding: how much each input channel of each matrix carries.

int4's grid (model/quant.py) is fitted to a group's squared error weighted by its input channels'
mean squares over a calibration text: sum_k E[x_k^2] (W - Q)[n, k]^2, the diagonal of the
product's X^T X / T (llama.cpp's "importance matrix"). A channel that carries large inputs gets
its weights kept closer. On the real Gemma 3 270M this takes int4's perplexity change from +27%
to +8-9%, with any English text of 2k tokens or more (docs/EXPERIMENTS.md, "A calibration text
for the weighted int4 grid").

    calibration = Calibration.chosen(tokenizer, cfg)   # None: GEMMA_BATCH_CALIBRATION=off
    load_converted(checkpoint, WeightFormat.parse("int4"), cache_root(), calibration)

The pass runs the model on the CPU backend one layer at a time: each layer's weights are read,
widened to float32, run over the text (WINDOWS_A_STEP windows a step) and dropped before the next
layer. So it holds one layer and the text's activations, never the model: a 27B layer is 1.7 GB
as float32, the activations of 2k tokens 44 MB. The bundled text is 2k tokens of the project's own docs
(calibration.txt); `GEMMA_BATCH_CALIBRATION` names another text file, or `off` (the unweighted
grid).

Shapes: T the text's tokens (windows of at most WINDOW, each after <bos>), H hidden, K a
matrix's inputs.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..backends.base import StepBatch
from ..backends.cpu_math import F32, embed_rows
from ..backends.placement import Segment
from ..model.checkpoint import Checkpoint, Tensor, to_float32
from ..model.config import Gemma3Config
from ..model.quant import WeightFormat, weights_label
from ..model.tokenizer import Tokenizer
from ..switches import OFF

BUNDLED_TEXT = Path(__file__).with_name("calibration.txt")
TEXT_SWITCH = "GEMMA_BATCH_CALIBRATION"
WINDOW = 512  # tokens a window, <bos> included (as the experiments measured)
WINDOWS_A_STEP = 4  # windows run at a time through a layer (a 27B's MLP holds 2k x 21,504 floats)
MAX_TOKENS = 32_768  # of a text, the first (the bundled one has 1,987; 2k already gives nearly all)
BLOCK = 16  # KV block size of the pass
# The rows each layer input feeds: `CpuBackend`'s observer names them.
INPUTS = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o": ("self_attn.o_proj",),
          "gate_up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}


@dataclass(frozen=True)
class Calibration:
    """A calibration text for one model, as windows of token ids each starting with <bos>;
    `source` names the text (`model.quant_cache.ChannelWeights`)."""

    cfg: Gemma3Config
    windows: tuple[tuple[int, ...], ...]
    source: str

    @classmethod
    def from_text(cls, text: str, tokenizer: Tokenizer, cfg: Gemma3Config, source: str, window: int = WINDOW) -> Calibration:
        """`text`'s first MAX_TOKENS tokens, cut into windows of `window` (the last one shorter)."""
        ids = tokenizer.encode(text, add_bos=False)[:MAX_TOKENS]
        if not ids:
            raise ValueError(f"calibration text {source} has no tokens")
        step = min(window, cfg.max_position_embeddings) - 1
        return cls(cfg, tuple((Tokenizer.BOS_ID, *ids[i : i + step]) for i in range(0, len(ids), step)), source)

    @classmethod
    def chosen(cls, tokenizer: Tokenizer, cfg: Gemma3Config) -> Calibration | None:
        """The text `GEMMA_BATCH_CALIBRATION` names (None when it says off), else the bundled one.
        A text that cannot be read fails, naming the file."""
        value = os.environ.get(TEXT_SWITCH, "").strip()
        if value.lower() in OFF:
            return None
        path = Path(value) if value else BUNDLED_TEXT
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"{TEXT_SWITCH}: cannot read the calibration text {path}: {e}") from None
        return cls.from_text(text, tokenizer, cfg, "the bundled text" if not value else str(path))

    @property
    def tokens(self) -> int:
        return sum(len(w) for w in self.windows)

    @property
    def key(self) -> str:
        """A digest of the token ids (a converted checkpoint's cache key includes it)."""
        h = hashlib.blake2b(digest_size=16)
        for window in self.windows:
            h.update(np.asarray(window, np.int64).tobytes() + b"|")
        return h.hexdigest()

    def channel_weights(self, checkpoint: Checkpoint) -> dict[str, np.ndarray]:
        """Every layer matrix's name -> float32 [K]: each input channel's mean square over the text."""
        from ..backends.cpu import CpuBackend  # (here: a run that does not calibrate never imports it)

        cfg = self.cfg
        steps = [prefill_batch(self.windows[i : i + WINDOWS_A_STEP], cfg, BLOCK)
                 for i in range(0, len(self.windows), WINDOWS_A_STEP)]
        blocks = {g.name: max(b[g.name] for _, b in steps) for g in cfg.kv_groups()}
        xs = [embedded(checkpoint, cfg, batch.token_ids) for batch, _ in steps]  # each [T, H]
        out: dict[str, np.ndarray] = {}
        for layer in range(cfg.num_layers):
            sums = Sums()
            backend = CpuBackend(cfg, segments=[Segment("cpu", 2 * layer + 1, 2 * layer + 2)], observe=sums.add)
            try:
                backend.load_weights(checkpoint.tensors(only=layer_names(checkpoint, layer)))
                backend.allocate_kv(blocks, BLOCK)
                xs = [backend.run_segment(0, batch, x) for (batch, _), x in zip(steps, xs)]
            finally:
                backend.close()
            for name, matrices in INPUTS.items():
                mean_square = (sums.values[name] / self.tokens).astype(np.float32)
                out.update((f"layers.{layer}.{m}.weight", mean_square) for m in matrices)
        return out

    def describe(self, seconds: float) -> str:
        """For the conversion's note."""
        return f"int4 grid weighted by {self.tokens:,} tokens of {self.source} (calibrated in {seconds:.1f} s)"


class Sums:
    """Per layer input, the sum over rows of each channel's square (float64), from any thread."""

    def __init__(self) -> None:
        self.values: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def add(self, layer: int, name: str, rows: np.ndarray) -> None:
        squares = np.einsum("tk,tk->k", rows, rows, dtype=np.float64)  # [K]
        with self._lock:
            self.values[name] = self.values.get(name, 0.0) + squares


def layer_names(checkpoint: Checkpoint, layer: int) -> set[str]:
    return {name for name in checkpoint.names if name.startswith(f"layers.{layer}.")}


def embedded(checkpoint: Checkpoint, cfg: Gemma3Config, token_ids: np.ndarray) -> np.ndarray:
    """The scaled embeddings [T, H] of `token_ids`, from the checkpoint's table (only their rows read)."""
    [(_, table)] = checkpoint.tensors(only={"embed_tokens.weight"})
    rows = embed_rows(table, token_ids) if not isinstance(table, Tensor) else to_float32(Tensor(table.dtype, table.data[token_ids]))
    return rows * F32(cfg.embed_scale)


def prefill_batch(windows: tuple[tuple[int, ...], ...], cfg: Gemma3Config, block_size: int) -> tuple[StepBatch, dict[str, int]]:
    """One step prefilling every window as its own sequence, over contiguous KV blocks (the same
    blocks in every KV group), and the blocks each group needs."""
    lens = np.array([len(w) for w in windows])
    starts = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    positions = np.concatenate([np.arange(n) for n in lens]).astype(np.int32)
    per_seq = -(-lens // block_size)
    first_block = np.concatenate([[0], np.cumsum(per_seq)])[:-1]
    table = np.full((len(windows), int(per_seq.max())), -1, np.int32)  # [S, max_blocks]
    for s, (first, count) in enumerate(zip(first_block, per_seq)):
        table[s, :count] = np.arange(first, first + count)
    seq_of = np.repeat(np.arange(len(windows)), lens)
    slots = (table[seq_of, positions // block_size] * block_size + positions % block_size).astype(np.int32)
    groups = [g.name for g in cfg.kv_groups()]
    batch = StepBatch(token_ids=np.concatenate([np.asarray(w, np.int32) for w in windows]), positions=positions,
                      seq_starts=starts, context_lens=lens.astype(np.int32), block_tables=dict.fromkeys(groups, table),
                      slots=dict.fromkeys(groups, slots), sample=np.zeros(len(windows), bool),
                      prompt_lens=lens.astype(np.int32))
    return batch, dict.fromkeys(groups, int(per_seq.sum()))


def int4_calibration(fmt: WeightFormat, tokenizer: Tokenizer, cfg: Gemma3Config) -> Calibration | None:
    """What an int4 conversion weighs its rounding by (`Calibration.chosen`); None for other formats."""
    return Calibration.chosen(tokenizer, cfg) if fmt.name == "int4" else None


def calibrated_label(fmt: WeightFormat, layout: Mapping[str, tuple[str, tuple[int, ...]]],
                     calibration: Calibration | None) -> str:
    """What a run's matrices are (`model.quant.weights_label`) with the digest of int4's calibration
    where there is one (`int4-g32+min weighted:1f0c...`): what a job's statistics and fingerprint
    record, so a job resumed under another calibration text starts again rather than mixes rows."""
    label = weights_label(fmt, layout)
    return label if calibration is None else f"{label} weighted:{calibration.key[:12]}"
