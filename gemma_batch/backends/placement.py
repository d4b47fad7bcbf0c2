"""Where each part of a model runs: a placement plan over the devices of a machine.

A plan names, for every layer, the device of its attention (with the layer's KV cache) and of its
feed-forward block, and the devices of the embedding and of the final norm, LM head and sampler.
A device is `cpu`, `vulkan:N` (a Vulkan device by index or part of its name, as `--device`
takes it) or `npu`.

Text form (`--place`): items between commas, each `[LAYERS:][PART=]DEVICE`, where LAYERS is `A`
or `A-B` (inclusive) and PART is `attention`, `ffn`, `embed` or `head`:

    0-17:vulkan:0,18-33:vulkan:1                      layer ranges, both parts of each layer
    attention=cpu,ffn=vulkan:0                         a part of every layer
    0-17:vulkan:0,18-33:attention=cpu,18-33:ffn=vulkan:1   both
    head=vulkan:0                                      the final norm, LM head and sampler

Every layer's attention and feed-forward block is placed exactly once (an overlap or a gap is an
error naming the layers); `embed` defaults to layer 0's attention device and `head` to the last
layer's feed-forward device. The activations cross between devices where consecutive parts sit
on different ones: embedding -> attention 0 -> ffn 0 -> attention 1 -> ... -> ffn L-1 -> head,
one hidden-size vector per token at each crossing.

A plan runs as segments (`Placement.segments`): runs of consecutive parts on one device, over
the path's indices (0 the embedding, 2i+1 layer i's attention, 2i+2 its feed-forward block,
2L+1 the head); a device holds the weights of its segments' parts (`held_tensors`) and the KV
of the layers whose attention it runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


PARTS = ("attention", "ffn")
ENDS = ("embed", "head")
ACTIVATION_BYTES = 4  # float32 residual stream per hidden unit


@dataclass(frozen=True)
class Segment:
    """Parts `first..last` (inclusive) of the path (module doc), run on `device`."""

    device: str
    first: int
    last: int

    def holds(self, kind: str, layer: int | None, num_layers: int) -> bool:
        """Whether the part (`part_of`'s kind and layer) is in this segment."""
        k = {"embed": 0, "head": 2 * num_layers + 1}.get(kind)
        k = 2 * layer + (1 if kind == "attention" else 2) if k is None else k
        return self.first <= k <= self.last

    def layers(self, num_layers: int) -> range:
        """The layers with a part in this segment."""
        return range(max(0, (self.first - 1) // 2), min(num_layers, (self.last + 1) // 2))


def held_tensors(names: Iterable[str], segments: Iterable[Segment], num_layers: int, tied: bool) -> list[str]:
    """The tensors among `names` that a device running `segments` holds: those of its parts, and
    the embedding where it runs the head of a model whose LM head is the embedding (`tied`)."""
    segments = list(segments)

    def held(name: str) -> bool:
        kind, layer = part_of(name)
        return any(s.holds(kind, layer, num_layers) or (tied and kind == "embed" and s.holds("head", None, num_layers))
                   for s in segments)

    return [name for name in names if held(name)]


class PlacementError(ValueError):
    """A `--place` text that does not describe one device for every part of the model."""


def parse_device(text: str) -> str:
    """`cpu`, `npu`, or `vulkan:N` / `vulkan:NAME` (a bare `vulkan` is `vulkan:0`)."""
    text = text.strip()
    if text in ("cpu", "npu"):
        return text
    if text == "vulkan":
        return "vulkan:0"
    if text.startswith("vulkan:") and text[len("vulkan:"):].strip():
        return "vulkan:" + text[len("vulkan:"):].strip()
    raise PlacementError(f"unknown device {text!r}: expected cpu, npu or vulkan:N (an index or part of a name)")


@dataclass(frozen=True)
class Placement:
    """One device per part: `attention[i]` and `ffn[i]` for layer i, `embed`, `head`."""

    attention: tuple[str, ...]
    ffn: tuple[str, ...]
    embed: str
    head: str

    @classmethod
    def single(cls, device: str, num_layers: int) -> Placement:
        return cls((device,) * num_layers, (device,) * num_layers, device, device)

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices used, in the order the activations first reach them."""
        return tuple(dict.fromkeys(self.path()))

    def path(self) -> list[str]:
        """The device of each part, in execution order."""
        return [self.embed, *(d for pair in zip(self.attention, self.ffn) for d in pair), self.head]

    def crossings(self) -> list[tuple[str, str, str]]:
        """(where, from device, to device) for each hand-over between devices, in execution order."""
        names = ["embed", *(f"{p} {i}" for i in range(len(self.attention)) for p in PARTS), "head"]
        path = self.path()
        return [(f"{names[k]} -> {names[k + 1]}", path[k], path[k + 1])
                for k in range(len(path) - 1) if path[k] != path[k + 1]]

    def segments(self) -> list[Segment]:
        """The runs of consecutive parts on one device, in execution order (module doc)."""
        out: list[Segment] = []
        for k, device in enumerate(self.path()):
            if out and out[-1].device == device:
                out[-1] = Segment(device, out[-1].first, k)
            else:
                out.append(Segment(device, k, k))
        return out

    def describe(self) -> str:
        """The plan in runs of layers: `layers 0-17: vulkan:0; layers 18-33: attention cpu, ffn vulkan:1`."""
        runs: list[tuple[int, int, str]] = []
        for i, (a, f) in enumerate(zip(self.attention, self.ffn)):
            what = a if a == f else f"attention {a}, ffn {f}"
            if runs and runs[-1][2] == what:
                runs[-1] = (runs[-1][0], i, what)
            else:
                runs.append((i, i, what))
        layers = "; ".join(f"layer{'s' if a != b else ''} {a}{f'-{b}' if a != b else ''}: {what}" for a, b, what in runs)
        return f"embed: {self.embed}; {layers}; head: {self.head}"


def parse_placement(text: str, num_layers: int) -> Placement:
    """The plan `text` describes for a model of `num_layers` layers (module doc)."""
    slots: dict[tuple[str, int], str] = {}
    ends: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise PlacementError(f"--place {text!r}: an empty item")
        layers = range(num_layers)
        if m := re.fullmatch(r"(\d+)(?:-(\d+))?:(.*)", item):
            first, last = int(m.group(1)), int(m.group(2) or m.group(1))
            if last < first or last >= num_layers:
                raise PlacementError(f"--place {item!r}: layers {first}-{last} are not within the model's 0-{num_layers - 1}")
            layers, item = range(first, last + 1), m.group(3)
        part, _, device = item.rpartition("=") if "=" in item else ("", "", item)
        device = parse_device(device)
        if part in ENDS:
            if len(layers) != num_layers:
                raise PlacementError(f"--place: {part} takes no layer range")
            if part in ends:
                raise PlacementError(f"--place: {part} is placed twice")
            ends[part] = device
            continue
        if part and part not in PARTS:
            raise PlacementError(f"--place: unknown part {part!r}: expected {', '.join(PARTS + ENDS)}")
        for kind in (part,) if part else PARTS:
            for i in layers:
                if (kind, i) in slots:
                    raise PlacementError(f"--place {text!r}: layer {i}'s {kind} is placed twice "
                                         f"({slots[kind, i]} and {device})")
                slots[kind, i] = device
    missing = [f"{kind} {i}" for i in range(num_layers) for kind in PARTS if (kind, i) not in slots]
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise PlacementError(f"--place {text!r}: no device for {shown}")
    attention = tuple(slots["attention", i] for i in range(num_layers))
    ffn = tuple(slots["ffn", i] for i in range(num_layers))
    return Placement(attention, ffn, ends.get("embed", attention[0]), ends.get("head", ffn[-1]))


def part_of(name: str) -> tuple[str, int | None]:
    """Which part a checkpoint tensor belongs to: ("attention" | "ffn", layer) or ("embed" | "head", None)."""
    if m := re.match(r"layers\.(\d+)\.(.*)", name):
        rest = m.group(2)
        ffn = rest.startswith(("mlp.", "pre_feedforward_layernorm", "post_feedforward_layernorm"))
        return ("ffn" if ffn else "attention"), int(m.group(1))
    return ("embed", None) if name.startswith("embed_tokens") else ("head", None)
