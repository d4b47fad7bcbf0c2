"""GGUF models (model/gguf_*.py) and model names (model/sources.py) on a GGUF of the demo model
that llama.cpp's layout and `gguf`'s writer make (tests/gguf_fixture.py): every tensor type a Gemma
GGUF uses converts to the tensors transformers' own GGUF loading makes (bit for bit where our
layouts hold its blocks, within their rounding elsewhere); the
hyper-parameters llama.cpp leaves out come back by its rules; bad files fail naming the file;
a conversion is made once; hub names resolve offline from a prepared cache."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from gemma_batch.job.spec import DEMO_MODEL
from gemma_batch.model.checkpoint import Checkpoint, to_float32
from gemma_batch.model.config import Gemma3Config
from gemma_batch.model.gguf_file import GGUFError, GGUFModel
from gemma_batch.model.quant import WeightFormat
from gemma_batch.model.quant_cache import load_converted
from gemma_batch.model.sources import ModelNotFound, model_folder
from tests.gguf_fixture import TYPES, write_gguf
from tests.test_run_job import gemma_batch, read_rows, write_jsonl

PROMPTS = [{"id": "a", "prompt": "And God said"}, {"id": "b", "prompt": "The sea was calm that morning, and"}]


@pytest.fixture(scope="module")
def demo_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "demo.gguf"
    write_gguf(path)
    return path


def test_every_tensor_type_converts_to_what_transformers_loads_from_the_gguf(demo_gguf, tmp_path):
    """The conversion's tensors, dequantized (`--weights bf16`), against transformers' own GGUF
    loading: equal where a layout holds the blocks (floats, Q8_0, Q5_0, Q4_0, Q4_1); Q4_K's scale and
    minimum rounded to fp16 (2^-11 of each, relative); other types re-rounded to int8 per 32 (half
    a step, 1/254 of the group's largest magnitude). A fused projection's parts share one format."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "hf"
    done = gemma_batch("convert", demo_gguf, folder)
    assert done.returncode == 0, done.stderr
    theirs = AutoModelForCausalLM.from_pretrained(demo_gguf.parent, gguf_file=demo_gguf.name, dtype=torch.float32)
    state = {name.removeprefix("model."): t.numpy() for name, t in theirs.state_dict().items()}
    config = Gemma3Config.from_dir(folder)
    checkpoint = Checkpoint.open(folder, config)
    types = {t.hf_name.removeprefix("model."): t.type_name for t in GGUFModel(demo_gguf).tensors}
    ours = dict(load_converted(checkpoint, WeightFormat.parse("bf16"), None).tensors)
    carried = dict(load_converted(checkpoint, WeightFormat.parse("auto"), None).tensors)
    assert sorted(ours) == sorted(n for n in state if n != "lm_head.weight")
    for name, tensor in ours.items():
        want, got = state[name], to_float32(tensor)
        kind, fmt = types[name], checkpoint.dtype(name)
        if fmt in ("F32", "F16", "BF16") or kind in ("Q8_0", "Q5_0") or (kind in ("Q4_0", "Q4_1") and fmt == "int4-g32+min"):
            assert np.array_equal(got, want), (name, kind)
            continue
        groups = np.abs(want.reshape(want.shape[0], -1, 32)).max(axis=2, keepdims=True)
        err = np.abs(got - want).reshape(groups.shape[0], -1, 32)
        if fmt == "int8-g32":  # re-rounded to int8 (a 4-bit type among int8 q/k/v too), the fp16 scale's own
            # rounding at most half an ulp, 2^-25 in fp16's subnormals (tiny groups), times 127 codes
            assert (err <= groups / 254 * (1 + 2**-9) + 127 * 2**-25).all(), (name, kind)
        else:  # Q4_K carried: codes exact, the group's scale s and minimum m rounded to fp16 (half an ulp each)
            pairs = np.abs(carried[name].scales.astype(np.float32))
            bound = 2**-11 * (15 * pairs[..., 0] + pairs[..., 1]) * (1 + 2**-10)
            assert kind == "Q4_K" and (err <= bound[..., None] + 1e-12).all() and err.max() > 0, (name, kind)
    for layer in range(config.num_layers):
        for parts in (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("mlp.gate_proj", "mlp.up_proj")):
            assert len({checkpoint.dtype(f"layers.{layer}.{p}.weight") for p in parts}) == 1
    assert {checkpoint.dtype(n) for n in ours if types[n] == "Q4_K"} >= {"int4-g32+min"}
    assert set(TYPES) <= {t.type_name for t in GGUFModel(demo_gguf).tensors}
    written = json.loads((folder / "config.json").read_text())
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size", "rms_norm_eps", "sliding_window", "vocab_size", "max_position_embeddings",
                "layer_types", "rope_parameters"):
        assert getattr(theirs.config, key) == written[key], key
    assert written["query_pre_attn_scalar"] == 64  # llama.cpp's 1 / sqrt(head_dim); transformers' GGUF loading assumes 256


def test_norm_weights_lose_the_one_llama_cpp_adds(demo_gguf, tmp_path):
    from safetensors import safe_open

    from tests.gguf_fixture import demo_tensors

    folder = tmp_path / "hf"
    assert gemma_batch("convert", demo_gguf, folder).returncode == 0
    with safe_open(folder / "model.safetensors", framework="np") as converted:
        for name, values in demo_tensors().items():
            if values.ndim == 1:  # (bf16 norms: w + 1 - 1 is exact in float32)
                assert np.array_equal(converted.get_tensor(name), values), name


@pytest.mark.parametrize("metadata,expected", [
    ({}, {"query_pre_attn_scalar": 64, "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
          "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}),
    # llama.cpp's 27B (62 layers): 1 / sqrt(hidden / heads), here 512 / 4
    ({"gemma3.block_count": 62, "gemma3.embedding_length": 512}, {"query_pre_attn_scalar": 128}),
    ({"gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 8.0},
     {"rope_parameters": {"full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}),
    ({"gemma3.attention.sliding_window": None}, {"layer_types": ["full_attention"] * 6}),
    ({"tokenizer.chat_template": "{{ messages }}"}, {"eos_token_id": [1, 106]}),
])
def test_hyper_parameters_llama_cpp_leaves_out_come_back_by_its_rules(tmp_path, metadata, expected):
    """The rules of llama.cpp's `llama-model.cpp` for `gemma3`: window pattern 6 when a window is
    set, local RoPE base 10,000 unscaled, linear scaling on global layers, the 27B's scale."""
    path = tmp_path / "m.gguf"
    write_gguf(path, metadata=metadata)
    config = GGUFModel(path).config()
    assert {key: config[key] for key in expected} == expected


@pytest.mark.parametrize("how,wanted", [
    ("llama", "holds a 'llama' model; gemma-batch runs Gemma 3"),
    ("clip", "vision projector (mmproj) GGUF"),
    ("truncated", "truncated"),
    ("Q8_K", "of type Q8_K, which gemma-batch cannot dequantize"),
    ("vision tensor", "'v.blk.0.attn_q.weight' is not part of a Gemma 3 text model"),
    ("garbage", "cannot be read as GGUF"),
])
def test_a_bad_gguf_fails_naming_the_file_and_why(tmp_path, how, wanted):
    path = tmp_path / "bad.gguf"
    if how in ("llama", "clip"):
        write_gguf(path, arch=how)
    elif how == "Q8_K":
        write_gguf(path, types=("Q8_0", "Q8_K"))
    elif how == "vision tensor":
        write_gguf(path, extra_tensor=("v.blk.0.attn_q.weight", "F32"))
    elif how == "garbage":
        path.write_bytes(b"not a gguf at all" * 10)
    else:
        write_gguf(path)
        path.write_bytes(path.read_bytes()[:-5000])
    with pytest.raises(GGUFError) as e:
        GGUFModel(path)
    assert wanted in str(e.value) and str(path) in str(e.value)
    src = write_jsonl(tmp_path / "in.jsonl", PROMPTS)
    done = gemma_batch("run", src, "--model", path, "--backend", "cpu", env={"GEMMA_BATCH_CACHE_DIR": str(tmp_path / "c")})
    assert done.returncode == 2 and wanted in done.stderr and "Traceback" not in done.stderr


def test_a_gguf_model_is_converted_once_and_runs_as_its_folder(demo_gguf, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", PROMPTS)
    env = {"GEMMA_BATCH_CACHE_DIR": str(tmp_path / "cache")}
    flags = ("--backend", "cpu", "--max-tokens", "8")
    first = gemma_batch("run", src, "--model", demo_gguf, *flags, "--output", tmp_path / "a.parquet", env=env)
    assert first.returncode == 0 and "converting" in first.stderr, first.stderr
    again = gemma_batch("run", src, "--model", demo_gguf, *flags, "--output", tmp_path / "b.parquet", env=env)
    assert again.returncode == 0 and "converting" not in again.stderr, again.stderr
    assert gemma_batch("convert", demo_gguf, tmp_path / "hf").returncode == 0
    folder = gemma_batch("run", src, "--model", tmp_path / "hf", *flags, "--output", tmp_path / "c.parquet")
    assert folder.returncode == 0
    texts = [[r["completion"] for r in read_rows(tmp_path / f"{n}.parquet")] for n in "abc"]
    assert texts[0] == texts[1] == texts[2] and all(texts[0])
    off = gemma_batch("run", src, "--model", demo_gguf, *flags, env={"GEMMA_BATCH_CACHE_DIR": "off"})
    assert off.returncode == 2 and "GEMMA_BATCH_CACHE_DIR=off" in off.stderr


def prepared_hub(tmp_path: Path, repo: str) -> Path:
    """A Hugging Face hub cache holding the demo model as `repo`, as `hf download` lays it out."""
    cache = tmp_path / "hub"
    root = cache / f"models--{repo.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.model", "tokenizer_config.json"):
        shutil.copy(DEMO_MODEL / name, snapshot / name)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    return cache


def test_a_hugging_face_name_runs_offline_from_the_hub_cache(tmp_path):
    cache = prepared_hub(tmp_path, "gemma-batch-tests/demo")
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    src = write_jsonl(tmp_path / "in.jsonl", PROMPTS)
    flags = ("--backend", "cpu", "--max-tokens", "8")
    named = gemma_batch("run", src, "--model", "gemma-batch-tests/demo", *flags, "--output", tmp_path / "n.parquet", env=env)
    assert named.returncode == 0, named.stderr
    local = gemma_batch("run", src, "--model", DEMO_MODEL, *flags, "--output", tmp_path / "l.parquet")
    assert [r["completion"] for r in read_rows(tmp_path / "n.parquet")] == [r["completion"] for r in read_rows(tmp_path / "l.parquet")]
    missing = gemma_batch("run", src, "--model", "gemma-batch-tests/nothing", *flags, env=env)
    assert missing.returncode == 2 and "gemma-batch-tests/nothing is not in the Hugging Face cache" in missing.stderr
    assert "HF_HUB_OFFLINE" in missing.stderr


def test_hub_failures_say_what_to_do(monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    for error, wanted in ((GatedRepoError, "accept its terms at https://huggingface.co/google/gemma-3-4b-it"),
                          (RepositoryNotFoundError, "no such model on the Hugging Face Hub")):
        def fail(*args, error=error, **kwargs):
            raise error("refused", response=SimpleNamespace(headers={}, request=None))

        monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
        with pytest.raises(ModelNotFound) as e:
            model_folder("google/gemma-3-4b-it", io.StringIO())
        assert wanted in str(e.value) and "HF_TOKEN" in str(e.value)


def test_names_that_are_nothing_say_what_was_tried(tmp_path, monkeypatch):
    from gemma_batch.model import sources

    for value, wanted in ((tmp_path / "nope", "does not exist"), (tmp_path / "nope.gguf", "model file"),
                          ("not-a-model", "one of the models gemma-batch installs: gemma-3-270m")):
        with pytest.raises(ModelNotFound) as e:
            model_folder(value, io.StringIO())
        assert wanted in str(e.value)
    monkeypatch.setitem(sources.INSTALLED, "gemma-3-270m", ("no_such_package_here", "gemma-3-270m"))
    with pytest.raises(ModelNotFound) as e:
        model_folder("gemma-3-270m", io.StringIO())
    assert "pip install 'gemma-batch[gemma-3-270m]'" in str(e.value) and "Gemma Terms of Use" in str(e.value)


def test_a_job_file_keeps_model_names_and_resolves_model_paths(tmp_path):
    from gemma_batch.job.job_file import load_toml

    job = tmp_path / "jobs" / "job.toml"
    job.parent.mkdir()
    for model, expected in (("google/gemma-3-4b-it", "google/gemma-3-4b-it"), ("gemma-3-270m", "gemma-3-270m"),
                            ("../m.gguf", tmp_path / "m.gguf"), ("models/x", job.parent / "models/x")):
        (job.parent / "models" / "x").mkdir(parents=True, exist_ok=True)
        job.write_text(f'input = "in.jsonl"\nmodel = "{model}"\n')
        assert load_toml(job)["model"] == expected
