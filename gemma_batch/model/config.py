"""Gemma 3 text-model configuration, read from a Hugging Face `config.json`.

Two layouts exist on the hub:

* `Gemma3ForCausalLM` (the 1B): the text fields at the top level, `model_type: gemma3_text`.
* `Gemma3ForConditionalGeneration` (4B/12B/27B): the text fields nested in `text_config`,
  many of them omitted, so transformers' `Gemma3TextConfig` defaults are filled in here.

Both the legacy fields written by transformers 4.50 (`rope_theta`, `rope_local_base_freq`,
`rope_scaling`, `sliding_window_pattern`) and the newer ones (`layer_types`, `rope_parameters`)
are accepted. Resolution follows `Gemma3TextConfig.__post_init__` / `convert_rope_params_to_dict`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FULL = "full_attention"
SLIDING = "sliding_attention"

# transformers' Gemma3TextConfig class defaults (v5.23), used for fields a config omits.
_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "attention_bias": False,
    "final_logit_softcapping": None,
    "use_bidirectional_attention": False,
    "tie_word_embeddings": True,
    "pad_token_id": 0,
    "bos_token_id": 2,
    "eos_token_id": 1,
}
_DEFAULT_THETA = {FULL: 1_000_000.0, SLIDING: 10_000.0}
_SUPPORTED_ARCHS = ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
_SUPPORTED_ACTIVATIONS = ("gelu_pytorch_tanh",)


class ConfigError(ValueError):
    """The config describes a model this engine cannot run (or is not a config at all)."""


@dataclass(frozen=True)
class RopeSpec:
    """One RoPE table: `inv_freq[i] = 1 / theta**(2i/head_dim) / factor` (linear scaling)."""

    theta: float
    factor: float = 1.0


@dataclass(frozen=True)
class KVGroup:
    """Layers that share one block table: all global layers, or all sliding-window layers.

    `window` is None for global layers; for sliding layers a query at position q sees keys
    k with q - window < k <= q, so at most `window` keys per sequence need to be cached.
    """

    name: str  # FULL or SLIDING
    layers: tuple[int, ...]
    window: int | None


@dataclass(frozen=True)
class Gemma3Config:
    """The resolved Gemma 3 text-decoder hyper-parameters (see gemma3_spec.md §1)."""

    vocab_size: int
    hidden_size: int  # H
    intermediate_size: int  # I
    num_layers: int  # L
    num_heads: int  # nh
    num_kv_heads: int  # nkv
    head_dim: int  # hd (not H / nh in general)
    query_pre_attn_scalar: float  # attention scale is query_pre_attn_scalar ** -0.5
    sliding_window: int  # W: keys seen by a local-layer query, itself included
    layer_types: tuple[str, ...]  # FULL or SLIDING per layer
    rope: dict[str, RopeSpec]  # per layer type
    max_position_embeddings: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    bos_token_id: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    layout: str  # "causal_lm" (model.*) or "conditional_generation" (language_model.model.*)

    @property
    def attn_scale(self) -> float:
        return self.query_pre_attn_scalar**-0.5

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.hidden_size)

    @property
    def q_width(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_groups(self) -> tuple[KVGroup, ...]:
        """The KV groups the model declares: global layers keep everything, local ones a window."""
        groups = []
        for name in (FULL, SLIDING):
            layers = tuple(i for i, t in enumerate(self.layer_types) if t == name)
            if layers:
                groups.append(KVGroup(name, layers, None if name == FULL else self.sliding_window))
        return tuple(groups)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Gemma3Config:
        path = Path(model_dir) / "config.json"
        if not Path(model_dir).is_dir():
            what = "is not a directory" if Path(model_dir).exists() else "does not exist"
            raise FileNotFoundError(f"model directory {model_dir} {what}")
        if not path.is_file():
            raise FileNotFoundError(f"config.json not found in {model_dir}")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a JSON object, found {type(raw).__name__}")
        try:
            return cls.from_dict(raw)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Gemma3Config:
        """Resolve a parsed `config.json` of either Hugging Face layout."""
        archs = raw.get("architectures") or []
        model_type = raw.get("model_type")
        if model_type == "gemma3" or "Gemma3ForConditionalGeneration" in archs:
            text = raw.get("text_config")
            if text is None:
                text = {}
            if not isinstance(text, dict):
                raise ConfigError("text_config must be an object")
            text = dict(text)
            text.setdefault("model_type", "gemma3_text")
            # The multimodal configs keep token ids and tying at the top level.
            for key in ("bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings"):
                if key in raw and key not in text:
                    text[key] = raw[key]
            layout = "conditional_generation"
        elif model_type == "gemma3_text":
            text, layout = raw, "causal_lm"
        else:
            found = model_type or (archs[0] if archs else "nothing")
            raise ConfigError(
                f"unsupported model type {found!r}: gemma-batch runs Gemma 3 text models "
                f"(model_type 'gemma3_text' or 'gemma3', architectures {', '.join(_SUPPORTED_ARCHS)})"
            )
        if archs and not any(a in _SUPPORTED_ARCHS for a in archs):
            raise ConfigError(f"unsupported architectures {archs}; supported: {', '.join(_SUPPORTED_ARCHS)}")
        if text.get("model_type", "gemma3_text") != "gemma3_text":
            raise ConfigError(f"unsupported text model type {text.get('model_type')!r}; expected 'gemma3_text'")
        return _resolve_text(text, layout)


def _resolve_text(text: dict[str, Any], layout: str) -> Gemma3Config:
    def get(key: str) -> Any:
        value = text.get(key)
        return _TEXT_DEFAULTS[key] if value is None and key in _TEXT_DEFAULTS else value

    if get("use_bidirectional_attention"):
        raise ConfigError(
            "use_bidirectional_attention is true (an EmbeddingGemma-style encoder); "
            "gemma-batch supports only causal Gemma 3 language models"
        )
    if get("attention_bias"):
        raise ConfigError("attention_bias is true; Gemma 3 has no attention biases and gemma-batch supports none")
    if get("final_logit_softcapping") is not None:
        raise ConfigError(
            f"final_logit_softcapping is {get('final_logit_softcapping')}; Gemma 3 checkpoints set it to null "
            "and gemma-batch supports only that"
        )
    act = get("hidden_activation")
    if act not in _SUPPORTED_ACTIVATIONS:
        raise ConfigError(f"hidden_activation {act!r} is not supported; Gemma 3 uses 'gelu_pytorch_tanh'")

    num_layers = _positive_int(get("num_hidden_layers"), "num_hidden_layers")
    layer_types = text.get("layer_types")
    if layer_types is None:
        pattern = text.get("sliding_window_pattern", text.get("_sliding_window_pattern", 6))
        pattern = _positive_int(pattern, "sliding_window_pattern")
        layer_types = [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
    layer_types = tuple(layer_types)
    if len(layer_types) != num_layers or any(t not in (FULL, SLIDING) for t in layer_types):
        raise ConfigError(
            f"layer_types must list {num_layers} entries of {FULL!r} or {SLIDING!r}, found {list(layer_types)}"
        )

    num_heads = _positive_int(get("num_attention_heads"), "num_attention_heads")
    num_kv_heads = _positive_int(get("num_key_value_heads"), "num_key_value_heads")
    if num_heads % num_kv_heads:
        raise ConfigError(f"num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv_heads}")
    eos = get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (eos,)
    return Gemma3Config(
        vocab_size=_positive_int(get("vocab_size"), "vocab_size"),
        hidden_size=_positive_int(get("hidden_size"), "hidden_size"),
        intermediate_size=_positive_int(get("intermediate_size"), "intermediate_size"),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=_positive_int(get("head_dim"), "head_dim"),
        query_pre_attn_scalar=float(get("query_pre_attn_scalar")),
        sliding_window=_positive_int(get("sliding_window"), "sliding_window"),
        layer_types=layer_types,
        rope=_resolve_rope(text),
        max_position_embeddings=_positive_int(get("max_position_embeddings"), "max_position_embeddings"),
        rms_norm_eps=float(get("rms_norm_eps")),
        tie_word_embeddings=bool(get("tie_word_embeddings")),
        bos_token_id=int(get("bos_token_id")),
        eos_token_ids=tuple(int(i) for i in eos_ids if i is not None),
        pad_token_id=int(get("pad_token_id")),
        layout=layout,
    )


def _resolve_rope(text: dict[str, Any]) -> dict[str, RopeSpec]:
    """Per-layer-type RoPE, from `rope_parameters` (v5) or the legacy fields (v4.50 hub files).

    Legacy: `rope_scaling` applies to global layers only; `rope_local_base_freq` is the local theta.
    """
    params = text.get("rope_parameters")
    if params is not None and not (isinstance(params, dict) and set(params) <= {FULL, SLIDING}):
        raise ConfigError(f"rope_parameters must map {FULL!r}/{SLIDING!r} to RoPE settings, found {params!r}")
    params = {k: dict(v) for k, v in (params or {}).items()}
    params.setdefault(FULL, {"rope_type": "default"})
    params.setdefault(SLIDING, {"rope_type": "default"})
    if text.get("rope_scaling") is not None:
        params[FULL].update(text["rope_scaling"])
    if text.get("rope_theta") is not None:
        params[FULL].setdefault("rope_theta", text["rope_theta"])
    if text.get("rope_local_base_freq") is not None:
        params[SLIDING].setdefault("rope_theta", text["rope_local_base_freq"])
    specs = {}
    for kind, p in params.items():
        rope_type = p.get("rope_type", p.get("type", "default"))
        theta = float(p.get("rope_theta", _DEFAULT_THETA[kind]))
        if rope_type == "default":
            specs[kind] = RopeSpec(theta)
        elif rope_type == "linear":
            specs[kind] = RopeSpec(theta, float(p["factor"]))
        else:
            raise ConfigError(
                f"RoPE type {rope_type!r} on {kind} layers is not supported; Gemma 3 uses 'default' or 'linear'"
            )
    return specs


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, found {value!r}")
    return value
