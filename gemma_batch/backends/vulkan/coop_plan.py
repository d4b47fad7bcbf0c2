"""Which matmuls of the step run on the cooperative-matrix path, and what that lets a layer fuse.

A matmul runs there when the device has the path (`coop_min_chunk` given), its weights are
int8, int4 or fp16 tiles (coop_tiles.COOP_DTYPES) and its shape fits (coop_tiles.coop_fits).
Neighbouring matmuls both on the path share work (graph.py records it): a reduce writes the next
matmul's split input itself, and in decode steps attention makes its heads from qkv's K-chunk
sums (attention.comp QK_IN) and writes o's split (SPLIT_OUT).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ...model.config import Gemma3Config
from .coop_tiles import COOP_DTYPES, coop_decode_rows, coop_fits
from .variants import GATED_SPLIT_MAX_ROW
from .weights import DeviceWeights


@dataclass(frozen=True)
class LayerFusions:
    """One layer's fusions: `split_o`, attention writes o's split (o on the path); `split_gate`,
    o's reduce writes gate/up's; `split_down`, gate/up's reduce writes down's; `split_next_qkv`,
    down's reduce writes the next layer's qkv's; `heads_in_attention`, decode steps may leave qkv's
    reduce out (qkv and o on the path)."""

    split_o: bool
    split_gate: bool
    split_down: bool
    split_next_qkv: bool
    heads_in_attention: bool


class CoopPlan:
    def __init__(self, cfg: Gemma3Config, weights: DeviceWeights, coop_min_chunk: int | None) -> None:
        """`coop_min_chunk`: the path's shortest K chunk (coop_tiles.coop_chunks), None without the path."""
        self.cfg, self.w, self.coop_min_chunk = cfg, weights, coop_min_chunk

    @cached_property
    def decode_rows(self) -> int:
        """The most rows of a step on the decode tiles (coop_tiles.coop_decode_rows) for the layer
        matmuls this plan's weights (loaded by the first step) hold."""
        return coop_decode_rows(dtype for (layer, _), dtype in self.w.dtypes.items()
                                if 0 <= layer < self.cfg.num_layers and dtype in COOP_DTYPES)

    def on_coop(self, layer: int, key: str, N: int, K: int) -> bool:
        """Whether matmul `key` of `layer` (N outputs per weight; -1: the LM head, no layer past
        the last, nor a matmul a pipeline stage does not hold) runs on the cooperative path."""
        return (self.coop_min_chunk is not None and layer < self.cfg.num_layers and (layer, key) in self.w.dtypes
                and self.w.dtype(layer, key) in COOP_DTYPES and coop_fits(N, K))

    def layer(self, layer: int) -> LayerFusions:
        cfg = self.cfg
        H, I, qkv_n = cfg.hidden_size, cfg.intermediate_size, cfg.q_width + 2 * cfg.kv_width
        qkv, o = self.on_coop(layer, "qkv", qkv_n, H), self.on_coop(layer, "o_proj", H, cfg.q_width)
        gate, down = self.on_coop(layer, "gate_proj", I, H), self.on_coop(layer, "down_proj", H, I)
        return LayerFusions(split_o=o, split_gate=o and gate, split_down=gate and down and I <= GATED_SPLIT_MAX_ROW,
                            split_next_qkv=down and self.on_coop(layer + 1, "qkv", qkv_n, H),
                            heads_in_attention=qkv and o)
