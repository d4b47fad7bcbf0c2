"""Stream the text weights of a Hugging Face Gemma 3 safetensors checkpoint, one tensor at a time.

Files: `model.safetensors`, or shards listed by `model.safetensors.index.json` (`weight_map`:
tensor name -> shard file), found and their headers read by checkpoint_files.py (pickle
checkpoints are refused there, never unpickled). A quantized matrix (a GGUF's carried blocks) is
stored as `name.q` and `name.scales` in model/quant.py's layouts and read as a QuantizedTensor.

Names (gemma3_spec.md §4) are mapped to the canonical names of `weights.tensor_shapes`:

* `Gemma3ForCausalLM`: `model.<name>`, head `lm_head.weight`;
* `Gemma3ForConditionalGeneration`: `language_model.model.<name>` (or v5's in-memory
  `model.language_model.<name>`), head `language_model.lm_head.weight` or `lm_head.weight`;
  vision tensors (`vision_tower.*`, `multi_modal_projector.*`) are skipped; their data is never read.

`Checkpoint.open` reads and checks every header (names, dtypes, shapes, offsets, file sizes)
before any tensor data is read, so a bad checkpoint fails fast and nothing is half-loaded.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .checkpoint_files import CheckpointError, checkpoint_headers
from .config import Gemma3Config
from .quant import QuantizedTensor, WeightFormat, stored_format
from .safetensors_file import SafetensorsError, TensorEntry, read_tensor
from .weights import tensor_shapes

DEMO_MODEL = Path(__file__).resolve().parent.parent.parent / "sample_data" / "demo-model"  # bundled (README)
HEAD = "lm_head.weight"
SUPPORTED_DTYPES = ("BF16", "F16", "F32")  # of a checkpoint's tensors
CODES, SCALES = ".q", ".scales"  # a quantized matrix `name` is stored as `name.q` and `name.scales` (model/quant.py)
_VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")
# layout -> (prefixes of the decoder tensors, file names of the LM head)
_LAYOUTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "causal_lm": (("model.",), (HEAD,)),
    "conditional_generation": (
        ("language_model.model.", "model.language_model."),
        ("language_model.lm_head.weight", HEAD),
    ),
}


@dataclass(frozen=True)
class Tensor:
    """One tensor as stored: BF16 -> `data` holds the raw bits as uint16 (numpy has no bfloat16),
    F16 -> float16, F32 -> float32. `data` has the tensor's shape (e.g. [V, H] for the embedding)."""

    dtype: str  # "BF16" | "F16" | "F32"
    data: np.ndarray


def to_float32(t: Tensor) -> np.ndarray:
    """The tensor's values as float32, exactly (every BF16 and F16 value is a float32 value).

    BF16 is the upper half of a float32, so its bits shifted left by 16 *are* that float32. An F32
    tensor is returned as is (no copy); the others get a new array.
    """
    if t.dtype == "BF16":
        bits = t.data.astype(np.uint32)  # the one new [*shape] buffer; shifted in place
        bits <<= 16
        return bits.view(np.float32)
    if t.dtype in ("F16", "F32"):
        return np.asarray(t.data, dtype=np.float32)
    raise CheckpointError(f"to_float32: unsupported dtype {t.dtype!r}; supported: {', '.join(SUPPORTED_DTYPES)}")


@dataclass(frozen=True)
class _Source:
    """Where one canonical tensor lies: the file and the entry in its header."""

    path: Path
    entry: TensorEntry  # a quantized matrix's: its codes (`name.q`)
    scales: TensorEntry | None = None  # a quantized matrix's scales (`name.scales`), in the same file
    format: WeightFormat | None = None  # a quantized matrix's


class Checkpoint:
    """The validated text tensors of a checkpoint. Holds headers only, never tensor data.

    `names` is the load order: shard files in name order, each read front to back (by offset),
    so the files are read sequentially. `has_untied_head` is true when the files carry an LM
    head; with `tie_word_embeddings` true in the config the head is then loaded anyway ("if one
    is present, use it", as transformers does when it differs from the embedding).
    """

    def __init__(self, sources: dict[str, _Source], has_untied_head: bool) -> None:
        self._sources = sources
        self.has_untied_head = has_untied_head

    @property
    def names(self) -> list[str]:
        return list(self._sources)

    @property
    def files(self) -> list[Path]:
        return list(dict.fromkeys(s.path for s in self._sources.values()))

    @property
    def nbytes(self) -> int:
        """Bytes of all text tensors as stored (vision tensors excluded)."""
        return sum(s.entry.nbytes + (s.scales.nbytes if s.scales else 0) for s in self._sources.values())

    @property
    def layout(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Each tensor's stored dtype (a quantized matrix's: its format, `int8-g32`) and shape, in load order."""
        return {name: (self.dtype(name), self.shape(name)) for name in self._sources}

    def dtype(self, name: str) -> str:
        source = self._sources[name]
        return source.entry.dtype if source.format is None else str(source.format)

    def shape(self, name: str) -> tuple[int, ...]:
        source = self._sources[name]
        return source.entry.shape if source.format is None else (source.entry.shape[0], source.scales.shape[1] * source.format.group)

    def where(self, name: str) -> str:
        """Where a canonical tensor is stored: its name in the file, and the file."""
        source = self._sources[name]
        return f"{source.entry.name} in {source.path}"

    @classmethod
    def open(cls, model_dir: str | Path, cfg: Gemma3Config) -> Checkpoint:
        """Find the checkpoint files in `model_dir`, read every header and check it against
        `tensor_shapes(cfg)`. Reads no tensor data. Raises CheckpointError."""
        headers, where = checkpoint_headers(Path(model_dir))
        return cls._match(headers, cfg, where)

    @classmethod
    def _match(cls, headers: dict[Path, list[TensorEntry]], cfg: Gemma3Config, where: str) -> Checkpoint:
        """Map file names to canonical names and check dtypes and shapes against the config."""
        if cfg.layout not in _LAYOUTS:
            raise CheckpointError(f"unknown config layout {cfg.layout!r}; expected one of {', '.join(_LAYOUTS)}")
        prefixes, head_names = _LAYOUTS[cfg.layout]
        expected = tensor_shapes(cfg)
        expected.setdefault(HEAD, (cfg.vocab_size, cfg.hidden_size))  # "if one is present, use it"
        sources: dict[str, _Source] = {}
        for path, entries in headers.items():
            scales = {e.name.removesuffix(SCALES): e for e in entries if e.name.endswith(SCALES)}
            for e in entries:
                if e.name.startswith(_VISION_PREFIXES) or e.name.endswith(SCALES):
                    continue
                quantized = e.name.endswith(CODES) and e.name.removesuffix(CODES) in scales
                name = _canonical(e.name.removesuffix(CODES) if quantized else e.name, prefixes, head_names)
                if name is None or name not in expected:
                    raise CheckpointError(
                        f"{path}: unexpected tensor {e.name!r}: neither a text tensor of this config "
                        f"(names {', '.join(p + '*' for p in prefixes)}, {' or '.join(head_names)}; "
                        f"{cfg.num_layers} layers) nor a vision tensor"
                    )
                if name in sources:
                    other = sources[name]
                    raise CheckpointError(
                        f"{path}: tensor {e.name!r} duplicates {other.entry.name!r} in {other.path} "
                        f"(both are {name!r})"
                    )
                if quantized:
                    sources[name] = _quantized_source(path, e, scales.pop(e.name.removesuffix(CODES)), expected[name])
                    continue
                if e.dtype not in SUPPORTED_DTYPES:
                    raise CheckpointError(
                        f"{path}: tensor {e.name!r} has unsupported dtype {e.dtype}; "
                        f"supported: {', '.join(SUPPORTED_DTYPES)}"
                    )
                if e.shape != expected[name]:
                    raise CheckpointError(
                        f"{path}: tensor {e.name!r} has shape {list(e.shape)}, expected {list(expected[name])}"
                    )
                sources[name] = _Source(path, e)
            if scales:
                raise CheckpointError(f"{path}: {next(iter(scales))}{SCALES} holds the scales of no quantized tensor "
                                      f"({next(iter(scales))}{CODES} is missing)")
        has_head = HEAD in sources
        if cfg.tie_word_embeddings:
            del expected[HEAD]
        missing = [n for n in expected if n not in sources]
        if missing:
            shown = ", ".join(repr(head_names[0] if n == HEAD else prefixes[0] + n) for n in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise CheckpointError(f"{where}: {len(missing)} text tensor(s) missing: {shown}{more}")
        return cls(sources, has_untied_head=has_head)

    def tensors(self, only: Collection[str] | None = None) -> Iterator[tuple[str, Tensor | QuantizedTensor]]:
        """Yield `(canonical name, Tensor)` in `names` order (a quantized matrix as a
        QuantizedTensor), reading one tensor per step; only those named in `only` where given.

        The generator keeps no reference to a tensor once it is yielded; drop it (after copying
        what you need) before asking for the next one to hold at most one raw tensor.
        """
        by_file: dict[Path, list[tuple[str, _Source]]] = {}
        for name, src in self._sources.items():
            if only is not None and name not in only:
                continue
            by_file.setdefault(src.path, []).append((name, src))
        for path, items in by_file.items():
            with open(path, "rb", buffering=0) as f:
                for name, source in items:
                    yield name, _read(f, source)  # not bound to a local: the frame keeps no reference


def _read(f: BinaryIO, source: _Source) -> Tensor | QuantizedTensor:
    try:
        if source.format is not None:
            return QuantizedTensor(source.format, read_tensor(f, source.entry), read_tensor(f, source.scales))
        return Tensor(source.entry.dtype, read_tensor(f, source.entry))
    except SafetensorsError as e:
        raise CheckpointError(str(e)) from None


def _quantized_source(path: Path, codes: TensorEntry, scales: TensorEntry, shape: tuple[int, ...]) -> _Source:
    """A quantized matrix of `shape` stored as `codes` and `scales` (model/quant.py's layouts)."""
    fmt = stored_format((codes.dtype, codes.shape), (scales.dtype, scales.shape), shape) if len(shape) == 2 else None
    if fmt is None:
        raise CheckpointError(f"{path}: {codes.name} ({codes.dtype} {list(codes.shape)}) and {scales.name} ({scales.dtype} "
                              f"{list(scales.shape)}) are no quantized layout gemma-batch knows for a {list(shape)} matrix "
                              "(int8: I8 codes and F16 scales per 32; int4: U8 codes and F16 (scale, minimum) pairs)")
    return _Source(path, codes, scales, fmt)


def _canonical(file_name: str, prefixes: tuple[str, ...], head_names: tuple[str, ...]) -> str | None:
    if file_name in head_names:
        return HEAD
    for p in prefixes:
        if file_name.startswith(p) and file_name[len(p) :] != HEAD:  # `model.lm_head.weight` is no head
            return file_name[len(p) :]
    return None
