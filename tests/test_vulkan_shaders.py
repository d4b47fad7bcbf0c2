"""The shader sources and their committed SPIR-V: nothing stale, and every push-constant layout
written the same on both sides (GLSL `Push` block, numpy dtype in kernels.PUSH)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gemma_batch.backends.vulkan.kernels import PUSH, PUSH_BYTES, VARIANTS

SHADERS = Path(__file__).resolve().parent.parent / "shaders"
_GLSL_TYPES = {"uint": np.dtype(np.uint32), "int": np.dtype(np.int32), "float": np.dtype(np.float32)}


def test_committed_spirv_is_built_from_the_current_sources():
    done = subprocess.run([sys.executable, str(SHADERS / "build.py"), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, f"stale shaders; run `python shaders/build.py`:\n{done.stdout}{done.stderr}"


@pytest.mark.parametrize("edited", ["matmul.comp", "matmul_epilogue.glsl", "common.glsl"])
def test_the_staleness_check_notices_an_edited_source_or_header(tmp_path, monkeypatch, edited):
    sys.path.insert(0, str(SHADERS))
    import build  # shaders/build.py

    variant = VARIANTS["matmul_post_norm_bf16"]
    entry = build.load_manifest()[variant.name]
    assert entry["source"] == build.source_hash(variant)
    for name in ("matmul.comp", "matmul_epilogue.glsl", "common.glsl"):
        text = (SHADERS / name).read_text()
        (tmp_path / name).write_text(text + "\n// an edit\n" if name == edited else text)
    monkeypatch.setattr(build, "HERE", tmp_path)
    assert build.source_hash(variant) != entry["source"]


@pytest.mark.parametrize("family", sorted(PUSH))
def test_push_constant_blocks_match_their_numpy_layouts(family):
    source = (SHADERS / f"{family}.comp").read_text()
    block = re.search(r"layout\(push_constant\)\s*uniform\s+Push\s*\{(.*?)\}", source, re.S)
    assert block, f"{family}.comp has no Push block"
    fields = re.findall(r"(\w+)\s+(\w+)\s*;", block.group(1))
    assert [name for _, name in fields] == list(PUSH[family].names)
    assert [_GLSL_TYPES[t] for t, _ in fields] == [PUSH[family][name] for name in PUSH[family].names]
    assert PUSH[family].itemsize <= PUSH_BYTES


def test_every_variant_has_its_source():
    for variant in VARIANTS.values():
        assert (SHADERS / f"{variant.source}.comp").exists()
        assert variant.source in PUSH
