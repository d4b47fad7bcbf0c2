"""A checkpoint's tensors in a run's weight format, converted once and cached on disk.

    loaded = load_converted(checkpoint, WeightFormat.parse("int4"), cache_root())
    backend.load_weights(loaded.tensors)     # then loaded.note says what happened

bf16 streams the checkpoint as it is. Any other format converts each matrix (`model.quant`)
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
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from .checkpoint import Checkpoint, Tensor, to_float32
from .quant import QuantizedTensor, WeightFormat, carried_format, entry_shapes, quantize, to_fp16
from .safetensors_file import DTYPE_SIZES, SafetensorsError, SafetensorsWriter, read_header, read_tensor

CACHE_VERSION = "2"  # bump when a format's layout or rounding changes
CONVERT_ROWS = 512  # rows converted at a time, a block a thread: a 27B embedding table is 5.6 GB as float32
CONVERT_THREADS = 8  # at most (and at most the CPUs this process may use)
Loaded = Tensor | QuantizedTensor


def cache_root() -> Path | None:
    """Where converted weights are cached, or None when `GEMMA_BATCH_CACHE_DIR=off`."""
    env = os.environ.get("GEMMA_BATCH_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in ("", "off", "none") else Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gemma-batch"


def matrix_format(name: str, fmt: WeightFormat) -> WeightFormat:
    """The format a matrix gets under `fmt`: int4 keeps the embedding table (the tied LM head) in
    int8, which on the demo model keeps top-1 agreement at 93% instead of 91%."""
    if fmt.name == "int4" and name in ("embed_tokens.weight", "lm_head.weight"):
        return WeightFormat.parse("int8")
    return fmt


class ChannelWeights(Protocol):
    """What int4's rounding weighs each matrix's input channels by (`quantize.calibration.Calibration`):
    `channel_weights` maps matrix names to float32 [K]; `key` digests what they come from (the
    cache's key includes it); `describe` is the note for the log."""

    key: str

    def channel_weights(self, checkpoint: Checkpoint) -> dict[str, np.ndarray]: ...

    def describe(self, seconds: float) -> str: ...


def convert(name: str, tensor: Loaded, fmt: WeightFormat, channel_weights: np.ndarray | None = None) -> Loaded:
    """One checkpoint tensor in format `fmt`, converted CONVERT_ROWS rows at a time, on threads (a
    4b took 6 minutes to int4 on one). A quantized one (a GGUF's carried blocks) stays as it is
    under auto or when it is in the format asked, else is dequantized first (bf16: to float32).
    `channel_weights` [K]: what int4's rounding weighs the input channels by (`quant.quantize`)."""
    if isinstance(tensor, QuantizedTensor):
        if fmt.name == "auto" or matrix_format(name, fmt) == tensor.format:
            return tensor
        rows = range(0, tensor.shape[0], CONVERT_ROWS)
        if fmt.name == "bf16":  # (into one array: a concatenation's copy took as long as the dequantizing)
            values = np.empty(tensor.shape, np.float32)
            for r in rows:
                tensor.dequantize(slice(r, r + CONVERT_ROWS), out=values[r : r + CONVERT_ROWS])
            return Tensor("F32", values)
        blocks = (tensor.dequantize(slice(r, r + CONVERT_ROWS)) for r in rows)
    else:
        if not fmt.converts(tensor.data.shape):
            return tensor
        rows = range(0, tensor.data.shape[0], CONVERT_ROWS)
        # One block in float32 at a time: each is converted before the next is widened.
        blocks = (to_float32(Tensor(tensor.dtype, tensor.data[r : r + CONVERT_ROWS])) for r in rows)
    mfmt = matrix_format(name, fmt)
    mfmt.check_shape(name, tensor.shape if isinstance(tensor, QuantizedTensor) else tensor.data.shape)
    if mfmt.name == "fp16":
        return Tensor("F16", np.concatenate([to_fp16(b) for b in blocks]))
    weights = channel_weights if mfmt.name == "int4" else None
    parts = _on_threads(lambda block: quantize(block, mfmt, weights), blocks)
    return QuantizedTensor(mfmt, np.concatenate([p.q for p in parts]), np.concatenate([p.scales for p in parts]))


def _on_threads(fn: Callable[[np.ndarray], QuantizedTensor], blocks: Iterator[np.ndarray]) -> list[QuantizedTensor]:
    """fn of each block, in order, on up to CONVERT_THREADS threads, with at most twice that many
    blocks read ahead (a block is widened to float32 only when its turn nears)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = max(1, min(CONVERT_THREADS, usable))
    out: list[QuantizedTensor] = []
    with ThreadPoolExecutor(threads, thread_name_prefix="gemma-batch-convert") as pool:
        pending: deque = deque()
        for block in blocks:
            pending.append(pool.submit(fn, block))
            if len(pending) >= 2 * threads:
                out.append(pending.popleft().result())
        out.extend(f.result() for f in pending)
    return out


def stored_entries(name: str, dtype: str, shape: tuple[int, ...], fmt: WeightFormat) -> list[tuple[str, str, tuple[int, ...]]]:
    """The cache file's (name, dtype, shape) entries for one checkpoint tensor of stored `dtype`
    (a carried format's name for a quantized matrix: `Checkpoint.layout`). Raises ValueError when
    the tensor cannot take the format (`WeightFormat.check_shape`)."""
    fmt_out = _converted_format(name, dtype, shape, fmt) or carried_format(dtype)
    if fmt_out is None:
        return [(name, dtype, shape)]
    if fmt_out.name in ("fp16", "bf16"):
        return [(name, "F16" if fmt_out.name == "fp16" else "F32", shape)]
    fmt_out.check_shape(name, shape)
    (q_dtype, q_shape), (s_dtype, s_shape) = entry_shapes(fmt_out, shape)
    return [(f"{name}.q", q_dtype, q_shape), (f"{name}.scales", s_dtype, s_shape)]


def _converted_format(name: str, dtype: str, shape: tuple[int, ...], fmt: WeightFormat) -> WeightFormat | None:
    """The format a tensor stored as `dtype` ends in under `fmt` (bf16: dequantized to float32),
    or None where it stays as stored."""
    carried = dtype not in DTYPE_SIZES
    if not carried:
        return matrix_format(name, fmt) if fmt.converts(shape) else None
    if fmt.name == "auto" or str(matrix_format(name, fmt)) == dtype:
        return None
    return matrix_format(name, fmt)


def converted_nbytes_by_dtype(layout: Mapping[str, tuple[str, tuple[int, ...]]], fmt: WeightFormat) -> dict[str, int]:
    """Bytes the tensors of `layout` (name -> stored dtype and shape, `Checkpoint.layout`) take in
    `fmt`, by storage kind: BF16 / F16 / F32, and INT8 / INT4 for quantized matrices (data and
    scales), for `Backend.weight_bytes`."""
    out: dict[str, int] = {}
    for name, (dtype, shape) in layout.items():
        kind, nbytes = _converted_nbytes(name, dtype, shape, fmt)
        out[kind] = out.get(kind, 0) + nbytes
    return out


def matrix_bits(layout: Mapping[str, tuple[str, tuple[int, ...]]], fmt: WeightFormat) -> str:
    """Bits a weight, scales included, of the layers' matrices and of the other matrices (the
    embedding table, an untied LM head) in `fmt`: "5.00 bits a weight in the layers' matrices, 8.50
    in the embedding"."""
    sums = {True: [0, 0], False: [0, 0]}  # in a layer? -> [bits, weights]
    for name, (dtype, shape) in layout.items():
        if len(shape) == 2:
            total = sums[name.startswith("layers.")]
            total[0] += 8 * _converted_nbytes(name, dtype, shape, fmt)[1]
            total[1] += int(np.prod(shape))
    (lb, lw), (eb, ew) = sums[True], sums[False]
    return f"{lb / max(lw, 1):.2f} bits a weight in the layers' matrices, {eb / max(ew, 1):.2f} in the embedding"


def _converted_nbytes(name: str, dtype: str, shape: tuple[int, ...], fmt: WeightFormat) -> tuple[str, int]:
    """The storage kind (`converted_nbytes_by_dtype`'s) and bytes of one tensor in `fmt`."""
    target = _converted_format(name, dtype, shape, fmt) or carried_format(dtype)  # (None: a float tensor kept)
    if target is None:
        return dtype, int(np.prod(shape)) * DTYPE_SIZES[dtype]
    if target.name == "bf16":
        return "F32", 4 * int(np.prod(shape))
    return "F16" if target.name == "fp16" else target.name.upper(), target.matrix_bytes(shape)


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
                yield name, QuantizedTensor(matrix_format(name, fmt), q, scales)
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
