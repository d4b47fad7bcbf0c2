"""Config resolution, checked field by field against transformers' own resolution of the same file."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig

from gemma_batch.model.config import FULL, SLIDING, ConfigError, Gemma3Config

# Legacy (transformers 4.50) hub files, as published: the 1B CausalLM config and the multimodal
# 4B/27B configs whose text_config omits most fields (gemma3_spec.md §1).
HUB_1B = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "attention_bias": False,
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "eos_token_id": [1, 106],
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "max_position_embeddings": 32768,
    "num_attention_heads": 4,
    "num_hidden_layers": 26,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "vocab_size": 262144,
}
HUB_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "mm_tokens_per_image": 256,
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "num_hidden_layers": 27},
}
HUB_27B = json.loads(json.dumps(HUB_4B))
HUB_27B["text_config"].update(
    hidden_size=5376, intermediate_size=21504, num_hidden_layers=62, num_attention_heads=32,
    num_key_value_heads=16, head_dim=128, query_pre_attn_scalar=168,
)


def write(tmp_path, raw: dict):
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return tmp_path


def hf_text_config(model_dir):
    cfg = AutoConfig.from_pretrained(model_dir)
    return cfg.get_text_config()


@pytest.mark.parametrize("raw", [HUB_1B, HUB_4B, HUB_27B], ids=["1b", "4b", "27b"])
def test_hub_configs_resolve_like_transformers(tmp_path, raw):
    ours = Gemma3Config.from_dir(write(tmp_path, raw))
    hf = hf_text_config(tmp_path)
    assert ours.vocab_size == hf.vocab_size
    assert ours.hidden_size == hf.hidden_size
    assert ours.intermediate_size == hf.intermediate_size
    assert ours.num_layers == hf.num_hidden_layers
    assert (ours.num_heads, ours.num_kv_heads, ours.head_dim) == (
        hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim
    )
    assert ours.query_pre_attn_scalar == hf.query_pre_attn_scalar
    assert ours.sliding_window == hf.sliding_window
    assert list(ours.layer_types) == list(hf.layer_types)
    assert ours.rms_norm_eps == hf.rms_norm_eps
    assert ours.max_position_embeddings == hf.max_position_embeddings
    for kind in (FULL, SLIDING):
        p = hf.rope_parameters[kind]
        assert ours.rope[kind].theta == p["rope_theta"]
        assert ours.rope[kind].factor == (p["factor"] if p["rope_type"] == "linear" else 1.0)


def test_real_shapes_and_derived_facts():
    """Spot values from gemma3_spec.md §1, which were read off the hub configs."""
    cfg_27b = Gemma3Config.from_dict(HUB_27B)
    assert cfg_27b.attn_scale == pytest.approx(168**-0.5)
    assert cfg_27b.kv_groups()[0].layers == tuple(range(5, 62, 6))  # 10 global layers
    assert cfg_27b.layer_types[-2:] == (SLIDING, SLIDING)
    assert cfg_27b.eos_token_ids == (1, 106)
    assert cfg_27b.layout == "conditional_generation"
    cfg_1b = Gemma3Config.from_dict(HUB_1B)
    assert cfg_1b.rope[FULL].factor == 1.0 and cfg_1b.rope[SLIDING].theta == 10_000
    assert cfg_1b.kv_groups()[1].window == 512


def test_v5_layer_types_and_rope_parameters(tmp_path):
    raw = dict(HUB_1B, num_hidden_layers=4, layer_types=[SLIDING, FULL, SLIDING, FULL])
    raw["rope_parameters"] = {
        FULL: {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5},
        SLIDING: {"rope_type": "default", "rope_theta": 2e4},
    }
    for key in ("rope_theta", "rope_local_base_freq", "rope_scaling", "sliding_window_pattern"):
        raw.pop(key)
    ours = Gemma3Config.from_dir(write(tmp_path, raw))
    hf = hf_text_config(tmp_path)
    assert list(ours.layer_types) == list(hf.layer_types) == [SLIDING, FULL, SLIDING, FULL]
    assert ours.rope[FULL].factor == 4.0 and ours.rope[FULL].theta == hf.rope_parameters[FULL]["rope_theta"]
    assert ours.rope[SLIDING].theta == hf.rope_parameters[SLIDING]["rope_theta"] == 2e4


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, "unsupported model type 'llama'"),
        (dict(HUB_1B, use_bidirectional_attention=True), "use_bidirectional_attention"),
        (dict(HUB_1B, rope_scaling={"rope_type": "yarn", "factor": 4.0}), "RoPE type 'yarn'"),
        (dict(HUB_1B, hidden_activation="gelu"), "hidden_activation 'gelu'"),
        (dict(HUB_1B, final_logit_softcapping=30.0), "final_logit_softcapping"),
        (dict(HUB_1B, num_hidden_layers=0), "num_hidden_layers must be a positive integer"),
        (dict(HUB_1B, num_key_value_heads=3), "not a multiple"),
        (dict(HUB_1B, layer_types=[FULL]), "layer_types must list 26 entries"),
    ],
)
def test_unsupported_configs_are_refused_with_what_was_found(tmp_path, raw, message):
    with pytest.raises(ConfigError, match=message) as err:
        Gemma3Config.from_dir(write(tmp_path, raw))
    assert str(tmp_path / "config.json") in str(err.value)


def test_missing_and_malformed_config_files_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"config.json not found in {tmp_path}"):
        Gemma3Config.from_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json: not valid JSON"):
        Gemma3Config.from_dir(tmp_path)
