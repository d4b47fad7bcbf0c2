"""A Gemma 3 GGUF as a Hugging Face folder, written once and cached.

    folder = converted(Path("gemma-3-270m-q4_k_m.gguf"), cache_root(), log)   # then a model dir

The folder holds `config.json` (`Gemma3ForCausalLM`), `model.safetensors` (F32, F16 and BF16
tensors as they are; quantized matrices carried in gemma-batch's layouts, gguf_blocks.py, as
`name.q` and `name.scales`, which checkpoint.py reads), `tokenizer.model` (gguf_tokenizer.py),
`tokenizer_config.json`, and the chat template where the file has one. The engine runs the
carried blocks as they are (`--weights auto`) or dequantizes them (`--weights bf16`). transformers
cannot read carried blocks: load the GGUF itself there (`from_pretrained(folder, gguf_file=name)`).

Cache entry: `<root>/gguf/<digest>-v<CONVERSION_VERSION>/`, the digest being blake2b of the GGUF's bytes (remembered by
path, size and modification time: quant_cache.content_digest), so a second run reads nothing but
the folder. A folder is built under a temporary name and renamed into place when complete.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import TextIO

import numpy as np

from .checkpoint import CODES, SCALES
from .gguf_blocks import CARRIED
from .gguf_file import GGUFModel, GGUFTensor
from .quant import WeightFormat, entry_shapes
from .gguf_tokenizer import sentencepiece_model
from .safetensors_file import SafetensorsWriter

CONVERSION_VERSION = "2"  # bump when what a conversion writes changes
_TOKENIZER_CONFIG = {"tokenizer_class": "GemmaTokenizer", "add_bos_token": True, "add_eos_token": False,
                     "padding_side": "left", "clean_up_tokenization_spaces": False}


def convert(path: Path, out_dir: Path) -> None:
    """Write the Hugging Face folder of the GGUF `path` to `out_dir` (which must not exist yet),
    atomically. Raises GGUFError for a file it cannot take."""
    model = GGUFModel(path)
    config = model.config()
    building = out_dir.with_name(f"{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    try:
        (building / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        _write_tokenizer(model, building)
        entries = [entry for t in model.tensors for entry in _entries(t, CARRIED.get(t.stored))]
        metadata = {"format": "pt", "source": path.name, "gemma_batch_conversion": CONVERSION_VERSION}
        with SafetensorsWriter(building / "model.safetensors", entries, metadata) as writer:
            for tensor in model.tensors:
                if tensor.stored in CARRIED:
                    parts = list(model.carried(tensor))
                    writer.write(f"{tensor.hf_name}{CODES}", np.concatenate([p.q for p in parts]))
                    writer.write(f"{tensor.hf_name}{SCALES}", np.concatenate([p.scales for p in parts]))
                else:
                    blocks = list(model.values(tensor))
                    writer.write(tensor.hf_name, blocks[0] if len(blocks) == 1 else np.concatenate(blocks))
        try:
            os.replace(building, out_dir)
        except OSError:
            if not (out_dir / "model.safetensors").is_file():  # (else another process converted it first)
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)


def _entries(tensor: GGUFTensor, fmt: WeightFormat | None) -> list[tuple[str, str, tuple[int, ...]]]:
    """The safetensors entries of one tensor: itself, or a carried matrix's codes and scales."""
    if fmt is None:
        return [(tensor.hf_name, tensor.stored, tensor.shape)]
    (q_dtype, q_shape), (s_dtype, s_shape) = entry_shapes(fmt, tensor.shape)
    return [(f"{tensor.hf_name}{CODES}", q_dtype, q_shape), (f"{tensor.hf_name}{SCALES}", s_dtype, s_shape)]


def _write_tokenizer(model: GGUFModel, folder: Path) -> None:
    ids = {key: int(model.field(f"tokenizer.ggml.{name}_token_id", default))
           for key, name, default in (("unk", "unknown", 3), ("pad", "padding", 0), ("eos", "eos", 1), ("bos", "bos", 2))}
    vocab = {"tokens": model.field("tokenizer.ggml.tokens"), "scores": model.field("tokenizer.ggml.scores"),
             "token_type": model.field("tokenizer.ggml.token_type"), **ids}
    if vocab["tokens"] is None or vocab["scores"] is None or vocab["token_type"] is None:
        raise ValueError(f"{model.path}: no SentencePiece vocabulary in its metadata (tokenizer.ggml.tokens, .scores, "
                         ".token_type); Gemma 3 GGUFs carry one")
    (folder / "tokenizer.model").write_bytes(sentencepiece_model(vocab))
    tokens = vocab["tokens"]
    names = {"bos_token": tokens[ids["bos"]], "eos_token": tokens[ids["eos"]], "pad_token": tokens[ids["pad"]],
             "unk_token": tokens[ids["unk"]]}
    (folder / "tokenizer_config.json").write_text(json.dumps({**_TOKENIZER_CONFIG, **names}, indent=2) + "\n")
    template = model.field("tokenizer.chat_template")
    if template is not None:
        (folder / "chat_template.jinja").write_text(template)


def converted(path: Path, folders: Path, digest: str, log: TextIO) -> Path:
    """The Hugging Face folder of the GGUF `path` (content digest `digest`) under `folders`,
    converted now if it is not there yet, saying so on `log`."""
    folder = folders / f"{digest}-v{CONVERSION_VERSION}"
    if (folder / "model.safetensors").is_file():
        return folder
    started = time.perf_counter()
    print(f"converting {path} to a Hugging Face folder in {folder} (once; GEMMA_BATCH_CACHE_DIR moves the cache, `gemma-batch cache --clear` empties it)",
          file=log)
    convert(path, folder)
    print(f"  converted in {time.perf_counter() - started:.1f} s", file=log)
    return folder
