"""A checkpoint's tensors in a run's weight format, converted once and cached on disk.

    loaded = load_converted(checkpoint, WeightFormat.parse("int4"), cache_root())
    backend.load_weights(loaded.tensors)     # then loaded.note says what happened

bf16 streams the checkpoint as it is. Any other format converts each matrix (`model.conversion`)
while streaming it to the backend, and writes the converted tensors to the cache on the way;
the next run with the same checkpoint and format reads the cache instead of converting again.

Cache entry: `<root>/weights/<key>.safetensors`. The key is a blake2b of CACHE_VERSION, the format,
and each checkpoint file's name and content digest; digests are remembered in
`<root>/weights/digests.json` by path, size and modification time, so an unchanged checkpoint is
read for hashing only once. A quantized matrix `name` is stored as `name.q` and `name.scales`,
everything else under its own name. An entry is written to a temporary file and renamed when
complete, so a killed run leaves none half-written; an entry that fails its checks is deleted
and rebuilt. The root is `$GEMMA_BATCH_CACHE_DIR` (`off` disables the cache), else
`$XDG_CACHE_HOME/gemma-batch`, else `~/.cache/gemma-batch`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from .checkpoint import Checkpoint, Tensor
from .conversion import Loaded, convert, matrix_bits, matrix_format, stored_entries
from .quant import QuantizedTensor, WeightFormat
from .safetensors_file import SafetensorsError, SafetensorsWriter, read_header, read_tensor

CACHE_VERSION = "2"  # bump when a format's layout or rounding changes


def cache_root() -> Path | None:
    """Where converted weights are cached, or None when `GEMMA_BATCH_CACHE_DIR=off`."""
    env = os.environ.get("GEMMA_BATCH_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in ("", "off", "none") else Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gemma-batch"


class ChannelWeights(Protocol):
    """What int4's rounding weighs each matrix's input channels by (`quantize.calibration.Calibration`):
    `channel_weights` maps matrix names to float32 [K]; `key` digests what they come from (the
    cache's key includes it); `describe` is the note for the log."""

    key: str

    def channel_weights(self, checkpoint: Checkpoint) -> dict[str, np.ndarray]: ...

    def describe(self, seconds: float) -> str: ...


@dataclass
class LoadedWeights:
    """The tensors to hand to `Backend.load_weights`, and, once they are consumed, a note for
    the job's log: where they came from and how long the conversion took."""

    tensors: Iterator[tuple[str, Loaded]]
    note: list[str]


def load_converted(checkpoint: Checkpoint, fmt: WeightFormat, root: Path | None,
                   calibration: ChannelWeights | None = None) -> LoadedWeights:
    """The checkpoint's tensors in `fmt`: as stored (bf16), from the cache, or converted now;
    int4 rounded with `calibration`'s channel weights where given (found before the first tensor
    is converted; `quantize.calibration`)."""
    note: list[str] = []
    if fmt.name in ("auto", "bf16"):  # as stored (bf16: carried quantized matrices dequantized)
        return LoadedWeights(((name, convert(name, t, fmt)) for name, t in checkpoint.tensors()), note)
    calibration = calibration if fmt.name == "int4" else None
    if root is None:
        return LoadedWeights(_convert_and_cache(checkpoint, fmt, None, note, calibration), note)
    weights_dir = root / "weights"
    weights_dir.mkdir(parents=True, exist_ok=True)
    path = weights_dir / f"{_key(checkpoint, fmt, weights_dir, calibration)}.safetensors"
    entries = _valid_entries(path, checkpoint, fmt)
    if entries is not None:
        return LoadedWeights(_read_cached(path, entries, checkpoint, fmt, note), note)
    return LoadedWeights(_convert_and_cache(checkpoint, fmt, path, note, calibration), note)


def _key(checkpoint: Checkpoint, fmt: WeightFormat, weights_dir: Path, calibration: ChannelWeights | None) -> str:
    h = hashlib.blake2b(digest_size=16)
    weighed = "" if fmt.name != "int4" else f"{calibration.key if calibration else 'unweighted'}\0"
    h.update(f"{CACHE_VERSION}\0{fmt}\0{weighed}".encode())
    for path in sorted(checkpoint.files):
        h.update(f"{path.name}\0{content_digest(path, weights_dir / 'digests.json')}\0".encode())
    return h.hexdigest()


def content_digest(path: Path, memo: Path) -> str:
    """blake2b of the file's bytes, remembered by (path, size, mtime)."""
    st = path.stat()
    stamp = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    try:
        known = json.loads(memo.read_text())
    except (OSError, ValueError):
        known = {}
    if stamp in known:
        return known[stamp]
    h = hashlib.blake2b(digest_size=16)
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    known[stamp] = h.hexdigest()
    tmp = memo.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(known, indent=1))
    tmp.replace(memo)
    return known[stamp]


def _planned(checkpoint: Checkpoint, fmt: WeightFormat) -> list[tuple[str, str, tuple[int, ...]]]:
    return [e for name in checkpoint.names for e in stored_entries(name, checkpoint.dtype(name), checkpoint.shape(name), fmt)]


def _valid_entries(path: Path, checkpoint: Checkpoint, fmt: WeightFormat) -> dict | None:
    """The cache file's header when it holds exactly the planned tensors; a bad file is removed."""
    if not path.exists():
        return None
    try:
        entries = {e.name: e for e in read_header(path)}
    except SafetensorsError:
        entries = {}
    planned = {name: (dtype, shape) for name, dtype, shape in _planned(checkpoint, fmt)}
    if {n: (e.dtype, e.shape) for n, e in entries.items()} != planned:
        path.unlink(missing_ok=True)
        return None
    return entries


def _read_cached(path: Path, entries: dict, checkpoint: Checkpoint, fmt: WeightFormat, note: list[str]) -> Iterator[tuple[str, Loaded]]:
    started = time.perf_counter()
    with path.open("rb") as f:
        for name in checkpoint.names:
            if f"{name}.q" in entries:
                q, scales = read_tensor(f, entries[f"{name}.q"]), read_tensor(f, entries[f"{name}.scales"])
                yield name, QuantizedTensor(matrix_format(name, fmt, checkpoint.shape(name)[1]), q, scales)
            else:
                e = entries[name]
                yield name, Tensor(e.dtype, read_tensor(f, e))
    note.append(f"{fmt} weights read from the cache {path} ({path.stat().st_size / 2**20:,.1f} MiB) "
                f"in {time.perf_counter() - started:.1f} s")


def _convert_and_cache(checkpoint: Checkpoint, fmt: WeightFormat, path: Path | None, note: list[str],
                       calibration: ChannelWeights | None = None) -> Iterator[tuple[str, Loaded]]:
    started = time.perf_counter()
    weights: dict[str, np.ndarray] = {}
    if calibration is not None:
        weights = calibration.channel_weights(checkpoint)
        note.append(calibration.describe(time.perf_counter() - started))
    tmp = None if path is None else path.with_suffix(f".{os.getpid()}.tmp")
    writer = None if tmp is None else SafetensorsWriter(tmp, _planned(checkpoint, fmt), {"format": str(fmt)})
    try:
        for name, tensor in checkpoint.tensors():
            out = convert(name, tensor, fmt, weights.get(name))
            if writer is not None:
                if isinstance(out, QuantizedTensor):
                    writer.write(f"{name}.q", out.q)
                    writer.write(f"{name}.scales", out.scales)
                else:
                    writer.write(name, out.data)
            yield name, out
        if writer is not None:
            writer.close()
            writer = None
            tmp.replace(path)
    finally:
        if writer is not None:  # the consumer stopped early or conversion failed
            writer.abort()
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    where = f", cached at {path} (once; `gemma-batch cache --clear` empties the cache)" if path is not None else " (cache off)"
    note.append(f"weights converted to {fmt} ({matrix_bits(checkpoint.layout, fmt)}, scales included) "
                f"in {time.perf_counter() - started:.1f} s{where}")
