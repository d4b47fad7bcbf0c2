"""Which files hold a Hugging Face checkpoint, and their headers, read and checked before any
tensor data: `model.safetensors`, or the shards `model.safetensors.index.json` lists (as in
transformers, the single file wins when both exist). Pickle checkpoints are refused, never
unpickled. checkpoint.py maps the headers' tensors onto the model's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .safetensors_file import SafetensorsError, TensorEntry, read_header

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.ckpt")


class CheckpointError(ValueError):
    """The checkpoint is missing, corrupt, or does not match the config; the message names the file."""


def checkpoint_headers(model_dir: Path) -> tuple[dict[Path, list[TensorEntry]], str]:
    """Every checkpoint file of `model_dir` with its header, and what to name in an error about
    the set (the single file, or the index). Raises CheckpointError."""
    if not model_dir.is_dir():
        raise CheckpointError(f"model directory {model_dir} does not exist or is not a directory")
    single, index = model_dir / SINGLE_FILE, model_dir / INDEX_FILE
    if single.is_file():  # transformers also prefers the single file when both exist
        return {single: _header(single)}, str(single)
    if not index.is_file():
        raise CheckpointError(_no_safetensors_message(model_dir))
    shard_names = _read_index(index)
    headers = {}
    for shard in sorted(shard_names):
        path = model_dir / shard
        if not path.is_file():
            raise CheckpointError(f"{index}: shard {shard} (holding {shard_names[shard][0]!r}, ...) is missing")
        headers[path] = _header(path)
    _check_index_matches_shards(index, shard_names, headers)
    return headers, str(index)


def _header(path: Path) -> list[TensorEntry]:
    try:
        return read_header(path)
    except SafetensorsError as e:
        raise CheckpointError(str(e)) from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None


def _read_index(index: Path) -> dict[str, list[str]]:
    """Parse `model.safetensors.index.json`; return shard file -> tensor names it should hold."""
    try:
        raw: Any = json.loads(index.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{index}: malformed index, not valid JSON ({e})") from None
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: malformed index, expected an object with a non-empty 'weight_map'")
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or "/" in shard or "\\" in shard or shard in (".", ".."):
            raise CheckpointError(
                f"{index}: malformed index, weight_map[{name!r}] is {shard!r}; expected a file name in the same folder"
            )
        shards.setdefault(shard, []).append(name)
    return shards


def _check_index_matches_shards(
    index: Path, shard_names: dict[str, list[str]], headers: dict[Path, list[TensorEntry]]
) -> None:
    """Every tensor the index lists is in its shard, and every shard holds only what the index lists."""
    for path, entries in headers.items():
        listed = set(shard_names[path.name])
        present = {e.name for e in entries}
        absent = [n for n in shard_names[path.name] if n not in present]
        if absent:
            raise CheckpointError(
                f"{path}: tensor {absent[0]!r} is listed in {index.name} for this shard but absent from it"
                + (f" ({len(absent)} such tensors)" if len(absent) > 1 else "")
            )
        extra = sorted(present - listed)
        if extra:
            raise CheckpointError(
                f"{path}: holds tensor {extra[0]!r}, which {index.name} does not list for this shard"
                + (f" ({len(extra)} such tensors)" if len(extra) > 1 else "")
            )


def _no_safetensors_message(model_dir: Path) -> str:
    pickles = sorted(p.name for pattern in _PICKLE_PATTERNS for p in model_dir.glob(pattern))
    if pickles:
        return (
            f"{model_dir}: no {SINGLE_FILE} or {INDEX_FILE}; found only pickle checkpoint(s) "
            f"{', '.join(pickles[:3])}{' ...' if len(pickles) > 3 else ''}. These are not loaded, since unpickling "
            "can run arbitrary code: convert the checkpoint to safetensors (e.g. in a trusted environment, "
            "transformers' from_pretrained then save_pretrained writes model.safetensors)"
        )
    return f"{model_dir}: no {SINGLE_FILE} and no {INDEX_FILE} found"
