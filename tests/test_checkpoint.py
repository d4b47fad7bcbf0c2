"""The safetensors checkpoint reader, against checkpoints written by transformers / safetensors.

The reference values are the torch models' own state dicts (and torch's bfloat16 -> float32
conversion), so every equality here is exact: a loader must not change a single bit.
"""

from __future__ import annotations

import copy
import json
import pickle
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch

from gemma_batch.backends.cpu import CpuBackend
from gemma_batch.model import checkpoint as checkpoint_module
from gemma_batch.model.checkpoint import Checkpoint, CheckpointError, Tensor, to_float32
from gemma_batch.model.config import Gemma3Config
from gemma_batch.model.quant import WeightFormat, quantize
from gemma_batch.model.weights import tensor_shapes
from tests.tiny_models import make_causal_lm, make_conditional_generation

# --- helpers -------------------------------------------------------------------------------


def tiny_cfg(layout: str = "causal_lm", **text) -> Gemma3Config:
    fields = dict(vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=4, sliding_window=4)  # fmt: skip
    fields.update(text)
    if layout == "causal_lm":
        return Gemma3Config.from_dict({"model_type": "gemma3_text", **fields})
    return Gemma3Config.from_dict({"model_type": "gemma3", "text_config": fields})


def text_arrays(cfg: Gemma3Config, prefix: str = "model.", dtype=np.float32, seed: int = 0) -> dict[str, np.ndarray]:
    """Random values for every decoder tensor of `cfg` (not the LM head), named `prefix + canonical`."""
    rng = np.random.default_rng(seed)
    shapes = {n: s for n, s in tensor_shapes(cfg).items() if n != "lm_head.weight"}
    return {prefix + n: rng.standard_normal(s).astype(dtype) for n, s in shapes.items()}


def pack(tensors: dict[str, tuple[str, np.ndarray]]) -> tuple[dict, bytes]:
    """A safetensors header and data section for `name -> (dtype, little-endian array)`."""
    header, chunks, pos = {}, [], 0
    for name, (dtype, arr) in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [pos, pos + len(raw)]}
        chunks.append(raw)
        pos += len(raw)
    return header, b"".join(chunks)


def write_raw(path: Path, header: dict | bytes, data: bytes, header_len: int | None = None) -> Path:
    blob = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob) if header_len is None else header_len) + blob + data)
    return path


def f32(arrays: dict[str, np.ndarray]) -> dict[str, tuple[str, np.ndarray]]:
    return {n: ("F32", a) for n, a in arrays.items()}


def open_error(model_dir: Path, cfg: Gemma3Config) -> str:
    with pytest.raises(CheckpointError) as info:
        Checkpoint.open(model_dir, cfg)
    return str(info.value)


def bytes_read_by_this_process() -> int:
    """`rchar` of /proc/self/io: bytes this process got from read() calls, whatever reads them."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


needs_proc_io = pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")


# --- checkpoints written by transformers ---------------------------------------------------


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """Tiny Gemma3ForCausalLM / Gemma3ForConditionalGeneration saved by `save_pretrained`, single
    file and sharded (~100 KB shards), plus a bfloat16 save. Value: (dir, state-dict prefix, model)."""
    root = tmp_path_factory.mktemp("hf")
    causal = make_causal_lm(root / "causal")
    causal.save_pretrained(root / "causal_sharded", max_shard_size="100KB")
    multi = make_conditional_generation(root / "multi", causal)
    multi.save_pretrained(root / "multi_sharded", max_shard_size="100KB")
    bf16 = copy.deepcopy(causal).to(torch.bfloat16)
    bf16.save_pretrained(root / "causal_bf16")
    return {
        "causal": (root / "causal", "model.", causal),
        "causal_sharded": (root / "causal_sharded", "model.", causal),
        "multi": (root / "multi", "model.language_model.", multi),
        "multi_sharded": (root / "multi_sharded", "model.language_model.", multi),
        "causal_bf16": (root / "causal_bf16", "model.", bf16),
    }


@pytest.mark.parametrize("key", ["causal", "causal_sharded", "multi", "multi_sharded", "causal_bf16"])
def test_every_text_tensor_equals_the_torch_state_dict(hf, key):
    model_dir, prefix, model = hf[key]
    cfg = Gemma3Config.from_dir(model_dir)
    state = model.state_dict()
    ck = Checkpoint.open(model_dir, cfg)
    if key.endswith("sharded"):
        assert (model_dir / "model.safetensors.index.json").is_file() and len(ck.files) >= 5
    assert sorted(ck.names) == sorted(tensor_shapes(cfg)) and not ck.has_untied_head
    seen = []
    for name, t in ck.tensors():
        ref = state[prefix + name]
        assert t.data.shape == tuple(ref.shape) == ck.shape(name)
        if key == "causal_bf16":
            assert t.dtype == ck.dtype(name) == "BF16" and t.data.dtype == np.uint16
            np.testing.assert_array_equal(t.data, ref.view(torch.int16).numpy().view(np.uint16))
            np.testing.assert_array_equal(to_float32(t), ref.float().numpy())
        else:
            assert t.dtype == "F32" and t.data.dtype == np.float32
            np.testing.assert_array_equal(t.data, ref.numpy())
        seen.append(name)
    assert seen == ck.names  # the documented order, every time
    assert [n for n, _ in ck.tensors()] == seen
    assert ck.nbytes == sum(state[prefix + n].numel() * state[prefix + n].element_size() for n in seen)


def test_vision_tensors_of_a_saved_multimodal_model_are_never_read(hf, monkeypatch):
    model_dir, _, _ = hf["multi"]
    read = []
    real = checkpoint_module.read_tensor
    monkeypatch.setattr(checkpoint_module, "read_tensor", lambda f, e: read.append(e.name) or real(f, e))
    names = [n for n, _ in Checkpoint.open(model_dir, Gemma3Config.from_dir(model_dir)).tensors()]
    assert len(read) == len(names) and all(n.startswith("language_model.model.") for n in read)


@needs_proc_io
def test_vision_bytes_are_not_read_from_the_file(tmp_path):
    """Measured by the kernel's count of bytes read, so it holds whatever function does the reading."""
    cfg = tiny_cfg("conditional_generation")
    text = text_arrays(cfg, "language_model.model.")
    vision = {"vision_tower.big.weight": np.ones((2048, 1024), np.float32)}  # 8 MiB, before the text data
    write_raw(tmp_path / "model.safetensors", *pack(f32({**vision, **text})))
    before = bytes_read_by_this_process()
    tensors = dict(Checkpoint.open(tmp_path, cfg).tensors())
    assert bytes_read_by_this_process() - before < 1 << 20
    assert set(tensors) == set(tensor_shapes(cfg))


# --- dtypes --------------------------------------------------------------------------------


def test_bf16_bits_and_float32_values_match_torch_including_special_values(tmp_path):
    cfg = tiny_cfg()
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40, -3e-39, 3.3895e38, 1.0, -2.5])
    tensors = {n: torch.from_numpy(a).to(torch.bfloat16) for n, a in text_arrays(cfg).items()}
    tensors["model.embed_tokens.weight"].view(-1)[: len(special)] = special.to(torch.bfloat16)
    safetensors.torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    for name, t in Checkpoint.open(tmp_path, cfg).tensors():
        ref = tensors["model." + name]
        assert t.dtype == "BF16" and t.data.dtype == np.uint16
        np.testing.assert_array_equal(t.data, ref.view(torch.int16).numpy().view(np.uint16))
        got = to_float32(t)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got.view(np.uint32), ref.float().numpy().view(np.uint32))  # NaN bits too


@pytest.mark.parametrize("np_dtype,st_dtype", [(np.float16, "F16"), (np.float32, "F32")])
def test_f16_and_f32_files(tmp_path, np_dtype, st_dtype):
    cfg = tiny_cfg()
    arrays = text_arrays(cfg, dtype=np_dtype)
    safetensors.numpy.save_file(arrays, str(tmp_path / "model.safetensors"))
    ck = Checkpoint.open(tmp_path, cfg)
    assert ck.nbytes == sum(a.nbytes for a in arrays.values())
    for name, t in ck.tensors():
        assert t.dtype == ck.dtype(name) == st_dtype and t.data.dtype == np_dtype
        np.testing.assert_array_equal(t.data, arrays["model." + name])
        np.testing.assert_array_equal(to_float32(t), arrays["model." + name].astype(np.float32))


def test_dtypes_may_differ_between_tensors(tmp_path):
    cfg = tiny_cfg()
    arrays = text_arrays(cfg)
    packed = {n: ("F16", a.astype(np.float16)) if "norm" in n else ("F32", a) for n, a in arrays.items()}
    write_raw(tmp_path / "model.safetensors", *pack(packed))
    ck = Checkpoint.open(tmp_path, cfg)
    assert ck.dtype("norm.weight") == "F16" and ck.dtype("embed_tokens.weight") == "F32"


@pytest.mark.parametrize("weights, group", [("int8", 32), ("int4", 32), ("int4", 64)])
def test_a_quantized_matrix_stored_as_codes_and_scales_reads_back_as_written(tmp_path, weights, group):
    """`name.q` + `name.scales` (a GGUF's carried blocks, model/quant.py's layouts) make one matrix
    of that format and the config's shape; a pair of other shapes, or scales without codes, fail
    naming the file."""
    cfg = tiny_cfg(hidden_size=64, intermediate_size=128, head_dim=32)
    arrays = text_arrays(cfg)
    name = "model.layers.1.mlp.down_proj.weight"  # [64, 128]
    fmt = WeightFormat("int4", group) if weights == "int4" else WeightFormat.parse(weights)  # the carried layouts
    stored = quantize(arrays.pop(name), fmt)
    packed = {**f32(arrays), f"{name}.q": ({"int8": "I8", "int4": "U8"}[weights], stored.q),
              f"{name}.scales": ("F16", stored.scales)}
    write_raw(tmp_path / "model.safetensors", *pack(packed))
    ck = Checkpoint.open(tmp_path, cfg)
    canonical = "layers.1.mlp.down_proj.weight"
    assert ck.dtype(canonical) == str(fmt) and ck.shape(canonical) == (64, 128)
    got = dict(ck.tensors())[canonical]
    assert got.format == fmt and np.array_equal(got.q, stored.q) and np.array_equal(got.scales, stored.scales)
    assert ck.nbytes == sum(a.nbytes for a in arrays.values()) + stored.nbytes

    wrong = {**packed, f"{name}.scales": ("F16", stored.scales[:, :1])}
    write_raw(tmp_path / "model.safetensors", *pack(wrong))
    message = open_error(tmp_path, cfg)
    assert str(tmp_path / "model.safetensors") in message and f"{name}.q" in message and "no quantized layout" in message
    orphan = {**f32(arrays), name: ("F32", stored.dequantize()), "model.norm.weight.scales": ("F16", stored.scales)}
    write_raw(tmp_path / "model.safetensors", *pack(orphan))
    assert "holds the scales of no quantized tensor" in open_error(tmp_path, cfg)


# --- the LM head ---------------------------------------------------------------------------


@pytest.mark.parametrize("layout,head", [("causal_lm", "lm_head.weight"),
                                         ("conditional_generation", "language_model.lm_head.weight"),
                                         ("conditional_generation", "lm_head.weight")])  # fmt: skip
def test_a_head_in_the_file_is_loaded_even_when_the_config_ties_it(tmp_path, layout, head):
    cfg = tiny_cfg(layout)
    prefix = "model." if layout == "causal_lm" else "language_model.model."
    arrays = {**text_arrays(cfg, prefix), head: np.full((16, 8), 0.5, np.float32)}
    safetensors.numpy.save_file(arrays, str(tmp_path / "model.safetensors"))
    ck = Checkpoint.open(tmp_path, cfg)
    assert cfg.tie_word_embeddings and ck.has_untied_head and "lm_head.weight" in ck.names
    np.testing.assert_array_equal(dict(ck.tensors())["lm_head.weight"].data, arrays[head])


def test_untied_config_without_a_head_is_missing_lm_head(tmp_path):
    cfg = tiny_cfg(tie_word_embeddings=False)
    write_raw(tmp_path / "model.safetensors", *pack(f32(text_arrays(cfg))))
    msg = open_error(tmp_path, cfg)
    assert "model.safetensors" in msg and "1 text tensor(s) missing: 'lm_head.weight'" in msg


def test_two_heads_are_an_error(tmp_path):
    cfg = tiny_cfg("conditional_generation")
    head = np.zeros((16, 8), np.float32)
    arrays = {**text_arrays(cfg, "language_model.model."), "lm_head.weight": head}
    arrays["language_model.lm_head.weight"] = head
    write_raw(tmp_path / "model.safetensors", *pack(f32(arrays)))
    msg = open_error(tmp_path, cfg)
    assert "duplicates" in msg and "'lm_head.weight'" in msg and "'language_model.lm_head.weight'" in msg


# --- refusing pickles ----------------------------------------------------------------------


class _WritesMarker:
    """Unpickling this creates the file `marker` (as a malicious checkpoint could run anything)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("file_name", ["pytorch_model.bin", "model.pt"])
def test_a_pickle_only_folder_is_refused_without_unpickling(tmp_path, file_name):
    (tmp_path / file_name).write_bytes(pickle.dumps(_WritesMarker(tmp_path / "MARKER")))
    probe = tmp_path / "probe"
    probe.mkdir()
    pickle.loads(pickle.dumps(_WritesMarker(probe / "MARKER")))  # the payload is live...
    assert (probe / "MARKER").exists()
    msg = open_error(tmp_path, tiny_cfg())
    assert not (tmp_path / "MARKER").exists()  # ...and the loader never ran it
    assert file_name in msg and "pickle" in msg and "not loaded" in msg and "safetensors" in msg


# --- errors --------------------------------------------------------------------------------


def test_no_checkpoint_at_all(tmp_path):
    msg = open_error(tmp_path, tiny_cfg())
    assert str(tmp_path) in msg and "no model.safetensors and no model.safetensors.index.json" in msg


def write_sharded(model_dir: Path, cfg: Gemma3Config) -> dict[str, dict]:
    """Two shards: embed + layer 0 in the first, the rest in the second. Returns the weight map."""
    arrays = text_arrays(cfg)
    first = {n: a for n, a in arrays.items() if "embed" in n or ".layers.0." in n}
    second = {n: a for n, a in arrays.items() if n not in first}
    weight_map = {}
    for shard, part in (("model-00001-of-00002.safetensors", first), ("model-00002-of-00002.safetensors", second)):
        write_raw(model_dir / shard, *pack(f32(part)))
        weight_map.update(dict.fromkeys(part, shard))
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return weight_map


def test_hand_written_index_loads(tmp_path):
    cfg = tiny_cfg()
    write_sharded(tmp_path, cfg)
    ck = Checkpoint.open(tmp_path, cfg)
    assert [p.name for p in ck.files] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert ck.names[0] == "embed_tokens.weight"


def test_a_missing_shard(tmp_path):
    cfg = tiny_cfg()
    write_sharded(tmp_path, cfg)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    msg = open_error(tmp_path, cfg)
    assert "model.safetensors.index.json" in msg and "shard model-00002-of-00002.safetensors" in msg
    assert "missing" in msg


@pytest.mark.parametrize("index,expect", [
    ("{not json", "not valid JSON"),
    ('["a list"]', "non-empty 'weight_map'"),
    ('{"metadata": {}}', "non-empty 'weight_map'"),
    ('{"weight_map": {"model.norm.weight": "../elsewhere.safetensors"}}', "weight_map['model.norm.weight']"),
    ('{"weight_map": {"model.norm.weight": 3}}', "weight_map['model.norm.weight'] is 3"),
])  # fmt: skip
def test_a_malformed_index(tmp_path, index, expect):
    (tmp_path / "model.safetensors.index.json").write_text(index)
    msg = open_error(tmp_path, tiny_cfg())
    assert "model.safetensors.index.json: malformed index" in msg and expect in msg


def test_a_tensor_listed_in_the_index_but_absent_from_its_shard(tmp_path):
    cfg = tiny_cfg()
    weight_map = write_sharded(tmp_path, cfg)
    weight_map["model.layers.0.extra.weight"] = "model-00001-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    msg = open_error(tmp_path, cfg)
    assert "model-00001-of-00002.safetensors" in msg and "'model.layers.0.extra.weight'" in msg
    assert "absent" in msg


def test_a_shard_holding_a_tensor_the_index_does_not_list(tmp_path):
    cfg = tiny_cfg()
    weight_map = write_sharded(tmp_path, cfg)
    del weight_map["model.norm.weight"]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    msg = open_error(tmp_path, cfg)
    assert "model-00002-of-00002.safetensors" in msg and "'model.norm.weight'" in msg and "does not list" in msg


def test_missing_tensors_are_listed_with_a_count(tmp_path):
    cfg = tiny_cfg()
    arrays = text_arrays(cfg)
    gone = [n for n in arrays if ".layers.1." in n][:7]
    write_raw(tmp_path / "model.safetensors", *pack(f32({n: a for n, a in arrays.items() if n not in gone})))
    msg = open_error(tmp_path, cfg)
    assert str(tmp_path / "model.safetensors") in msg and "7 text tensor(s) missing" in msg
    assert all(repr(n) in msg for n in gone[:5]) and "and 2 more" in msg


@pytest.mark.parametrize("name", ["model.layers.2.mlp.up_proj.weight", "model.extra.weight", "lm_head.bias",
                                  "model.lm_head.weight", "language_model.model.norm.weight"])  # fmt: skip
def test_an_unexpected_tensor(tmp_path, name):
    cfg = tiny_cfg()
    arrays = {**text_arrays(cfg), name: np.zeros(3, np.float32)}
    write_raw(tmp_path / "model.safetensors", *pack(f32(arrays)))
    msg = open_error(tmp_path, cfg)
    assert str(tmp_path / "model.safetensors") in msg and f"unexpected tensor {name!r}" in msg


def test_a_wrong_shape(tmp_path):
    cfg = tiny_cfg()
    arrays = {**text_arrays(cfg), "model.layers.1.self_attn.k_proj.weight": np.zeros((8, 8), np.float32)}
    write_raw(tmp_path / "model.safetensors", *pack(f32(arrays)))
    msg = open_error(tmp_path, cfg)
    assert str(tmp_path / "model.safetensors") in msg
    assert "'model.layers.1.self_attn.k_proj.weight' has shape [8, 8], expected [4, 8]" in msg


@pytest.mark.parametrize("dtype,np_dtype", [("F64", np.float64), ("I8", np.int8)])
def test_an_unsupported_dtype(tmp_path, dtype, np_dtype):
    cfg = tiny_cfg()
    packed = f32(text_arrays(cfg))
    packed["model.norm.weight"] = (dtype, np.zeros(8, np_dtype))
    write_raw(tmp_path / "model.safetensors", *pack(packed))
    msg = open_error(tmp_path, cfg)
    assert str(tmp_path / "model.safetensors") in msg and f"'model.norm.weight' has unsupported dtype {dtype}" in msg
    assert "BF16, F16, F32" in msg


def test_a_truncated_file(tmp_path):
    cfg = tiny_cfg()
    header, data = pack(f32(text_arrays(cfg)))
    write_raw(tmp_path / "model.safetensors", header, data[:-10])
    msg = open_error(tmp_path, cfg)
    assert str(tmp_path / "model.safetensors") in msg and "truncated" in msg


def test_a_file_truncated_after_open_fails_on_read_naming_the_tensor(tmp_path):
    cfg = tiny_cfg()
    path = write_raw(tmp_path / "model.safetensors", *pack(f32(text_arrays(cfg))))
    ck = Checkpoint.open(tmp_path, cfg)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: file is truncated: tensor 'model\.norm\.weight'"):
        list(ck.tensors())


def _corrupt(kind: str, header: dict, data: bytes) -> tuple[dict | bytes, bytes, int | None]:
    h = copy.deepcopy(header)
    if kind == "header_too_long":
        return h, data, 10**9
    if kind == "not_json":
        return b"{this is not json}", data, None
    if kind == "not_an_object":
        return b"[1, 2]", data, None
    if kind == "duplicate_key":
        blob = json.dumps(h)
        return (blob[:-1] + ', "model.norm.weight": ' + json.dumps(h["model.norm.weight"]) + "}").encode(), data, None
    if kind == "size_mismatch":
        h["model.norm.weight"]["shape"] = [9]
    elif kind == "overlap":
        b, e = h["model.norm.weight"]["data_offsets"]
        h["model.norm.weight"]["data_offsets"] = [b - 4, e - 4]
    elif kind == "past_the_data":
        b, e = h["model.norm.weight"]["data_offsets"]
        h["model.norm.weight"]["data_offsets"] = [b + 64, e + 64]
    elif kind == "bad_field":
        del h["model.norm.weight"]["data_offsets"]
    elif kind == "trailing_bytes":
        return h, data + b"\0" * 8, None
    return h, data, None


@pytest.mark.parametrize("kind,expect", [
    ("header_too_long", "header length 1000000000 exceeds"),
    ("not_json", "not a UTF-8 JSON object"),
    ("not_an_object", "expected a JSON object"),
    ("duplicate_key", "duplicate key 'model.norm.weight'"),
    ("size_mismatch", "'model.norm.weight': data_offsets"),
    ("overlap", "'model.norm.weight' has data_offsets"),
    ("past_the_data", "'model.norm.weight' has data_offsets"),
    ("bad_field", "'model.norm.weight' must have exactly"),
    ("trailing_bytes", "unexpected bytes after the last tensor"),
])  # fmt: skip
def test_a_corrupt_header(tmp_path, kind, expect):
    cfg = tiny_cfg()
    packed = f32(text_arrays(cfg))
    packed["model.norm.weight"] = packed.pop("model.norm.weight")  # last in the file
    write_raw(tmp_path / "model.safetensors", *_corrupt(kind, *pack(packed)))
    msg = open_error(tmp_path, cfg)
    assert str(tmp_path / "model.safetensors") in msg and expect in msg


def test_all_shards_are_checked_before_any_data_is_read(tmp_path, monkeypatch):
    cfg = tiny_cfg()
    write_sharded(tmp_path, cfg)
    header, data = pack(f32({n: a for n, a in text_arrays(cfg).items() if "embed" not in n and ".layers.0." not in n}))
    header["model.norm.weight"]["shape"] = [2, 4]  # same byte count, wrong shape, in the last shard
    write_raw(tmp_path / "model-00002-of-00002.safetensors", header, data)
    monkeypatch.setattr(checkpoint_module, "read_tensor", lambda f, e: pytest.fail(f"read {e.name} before validating"))
    assert "expected [8]" in open_error(tmp_path, cfg)


# --- memory --------------------------------------------------------------------------------


def test_streaming_holds_one_raw_tensor_at_a_time(tmp_path):
    """~17 MB of BF16 loaded into float32 copies: peak = what is kept + about one raw tensor."""
    cfg = tiny_cfg(vocab_size=1024, hidden_size=256, intermediate_size=1024, num_hidden_layers=8,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=64)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    tensors = {"model." + n: torch.randn(s, generator=gen).to(torch.bfloat16) for n, s in tensor_shapes(cfg).items()}
    safetensors.torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    del tensors
    ck = Checkpoint.open(tmp_path, cfg)
    largest = max(np.prod(ck.shape(n)) * 2 for n in ck.names)
    assert ck.nbytes > 16e6 and largest <= 0.04 * ck.nbytes

    kept, kept_bytes, held_beyond_kept = {}, 0, 0
    tracemalloc.start()
    try:
        for name, t in ck.tensors():
            kept[name] = to_float32(t)
            del t
            kept_bytes += kept[name].nbytes
            held_beyond_kept = max(held_beyond_kept, tracemalloc.get_traced_memory()[0] - kept_bytes)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept_bytes == 2 * ck.nbytes
    # Once the caller drops a raw tensor nobody holds it (measured ~32 KB of small Python objects
    # here; a reader that keeps the last tensor in a local holds up to `largest` = 512 KB).
    assert held_beyond_kept < 128 << 10, (held_beyond_kept, largest)
    # One raw tensor lives beside its float32 copy; holding all raw tensors would add ~17 MB.
    assert peak < kept_bytes + 2 * largest + (256 << 10), (peak, kept_bytes, largest)


def test_cpu_backend_load_peaks_near_the_float32_weights(tmp_path):
    """The CPU backend holds float32: loading a BF16 checkpoint peaks at that plus about one tensor."""
    cfg = tiny_cfg(vocab_size=1024, hidden_size=256, intermediate_size=1024, num_hidden_layers=8,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=64)  # fmt: skip
    tensors = {"model." + n: torch.randn(s).to(torch.bfloat16) for n, s in tensor_shapes(cfg).items()}
    safetensors.torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    del tensors
    ck = Checkpoint.open(tmp_path, cfg)
    largest = max(np.prod(ck.shape(n)) * 2 for n in ck.names)
    backend = CpuBackend(cfg)
    tracemalloc.start()
    try:
        backend.load_weights(ck.tensors())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    held = sum(a.nbytes for a in backend.weights.values())
    assert held == 2 * ck.nbytes
    assert peak < held + 3 * largest + (256 << 10), (peak, held, largest)
