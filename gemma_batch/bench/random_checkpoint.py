"""A checkpoint directory of a real Gemma 3 shape with random bf16 weights, for timing the job users
run (`gemma-batch run --model DIR`) where no real checkpoint is at hand.

It holds what `--model` reads: `config.json` (a `Gemma3ForCausalLM` of the shape), one
`model.safetensors` (the weights of `random_weights.random_tensors`, named as Hugging Face names
them) and the bundled demo model's `tokenizer.model`. That tokenizer has 4,096 pieces: prompts
tokenize into them and sampling never goes past them (the engine samples within the tokenizer's
vocabulary), while every product still runs over the shape's whole vocabulary. The end-of-sequence
id is the vocabulary's last, past the tokenizer's pieces at every real shape, so a completion runs
to its `max_tokens` as the bench's do.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..model.checkpoint import DEMO_MODEL
from ..model.safetensors_file import SafetensorsWriter
from .random_weights import layout, random_tensors
from .shapes import SHAPES, shape_config

DEMO_TOKENIZER = DEMO_MODEL / "tokenizer.model"
PREFIX = "model."  # Gemma3ForCausalLM's names: model.<name>


def write_random_checkpoint(shape: str, directory: Path, seed: int = 0) -> Path:
    """Write the checkpoint of `shape` into `directory` (made if missing) and return it. A directory
    that already holds this shape's checkpoint of this seed is kept as it is (a 4b one is 7.8 GB)."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = shape_config(shape)
    config = {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], **SHAPES[shape],
              "bos_token_id": 2, "pad_token_id": 0, "eos_token_id": cfg.vocab_size - 1,
              "torch_dtype": "bfloat16", "gemma_batch_random_seed": seed}
    marker = directory / "config.json"
    weights = directory / "model.safetensors"
    if marker.is_file() and weights.is_file() and json.loads(marker.read_text()) == config:
        return directory
    marker.unlink(missing_ok=True)  # written last: a checkpoint cut short is never taken as whole
    entries = [(PREFIX + name, dtype, shape) for name, (dtype, shape) in layout(cfg).items()]
    with SafetensorsWriter(weights, entries, {"format": "pt"}) as writer:
        for name, tensor in random_tensors(cfg, seed):
            writer.write(PREFIX + name, tensor.data)
    shutil.copyfile(DEMO_TOKENIZER, directory / "tokenizer.model")
    marker.write_text(json.dumps(config, indent=1))
    return directory
