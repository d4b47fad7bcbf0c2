"""The Python entry point: load a Gemma 3 model onto a backend and complete prompts."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from ..backends import create_backend, resolve_backend
from ..model.chat import chat_token_ids
from ..model.quant import WeightFormat
from ..model.quant_cache import cache_root, load_converted
from ..model.sources import open_model
from ..model.tokenizer import Tokenizer
from ..quantize.calibration import calibrated_label, int4_calibration
from .generate import generate_greedy

Messages = list[dict[str, str]]


class LLM:
    """A loaded model: config, tokenizer and a backend holding the weights.

    >>> llm = LLM("sample_data/demo-model")
    >>> llm.generate(["The sea"], max_tokens=8)
    """

    def __init__(self, model: str | Path, backend: str = "cpu", device: str | None = None,
                 weights: str = "auto", kv_dtype: str | None = None, log: TextIO | None = None,
                 int4_group: int = 32) -> None:
        """`model`: a Hugging Face folder, a GGUF file, `gemma-3-270m` or a hub name
        (`model.sources`: converted or fetched once, saying so on `log`, default stderr);
        `weights`: a format of `model.quant` (converted at load, cached as `gemma-batch run`
        caches it; `int4_group` its group size); `kv_dtype`: the KV cache's storage
        (`backends.kv_formats`; None: the backend's)."""
        log = log or sys.stderr
        self.model_dir, self.config, self.tokenizer, checkpoint = open_model(model, log)
        fmt = WeightFormat.parse(weights, int4_group)
        calibration = int4_calibration(fmt, self.tokenizer, self.config)
        self.weights = calibrated_label(fmt, checkpoint.layout, calibration)  # as they run: fp32 for a float32 "bf16"
        self.backend = create_backend(resolve_backend(backend, device)[0], self.config, device, kv_dtype, fmt.name)
        loaded = load_converted(checkpoint, fmt, cache_root(), calibration)
        self.backend.load_weights(loaded.tensors)
        for line in loaded.note:  # (a conversion, or the cache it was read from)
            print(line, file=log)

    def encode(self, prompt: str | Messages) -> list[int]:
        """Token ids of a plain prompt (with <bos>) or of a chat (template with generation prompt)."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_bos=True)
        return chat_token_ids(self.tokenizer, prompt, add_generation_prompt=True)

    def stop_token_ids(self, chat: bool) -> frozenset[int]:
        """The config's eos ids and <eos>; <end_of_turn> too for chat prompts."""
        stop = {*self.config.eos_token_ids, Tokenizer.EOS_ID}
        return frozenset(stop | {Tokenizer.END_OF_TURN_ID} if chat else stop)

    def generate(self, prompts: list[str | Messages], max_tokens: int = 64) -> list[str]:
        """Greedy completions, computed as one batch, without their stop token."""
        stops = [self.stop_token_ids(chat=not isinstance(p, str)) for p in prompts]
        completions = generate_greedy(self.backend, [self.encode(p) for p in prompts], max_tokens, stops)
        return [self.tokenizer.decode([t for t in c if t not in stop]) for c, stop in zip(completions, stops)]
