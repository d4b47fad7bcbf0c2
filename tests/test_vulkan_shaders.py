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


def test_the_staleness_check_notices_an_edited_source(tmp_path, monkeypatch):
    sys.path.insert(0, str(SHADERS))
    import build  # shaders/build.py

    variant = VARIANTS["norm_add"]
    entry = build.load_manifest()["norm_add"]
    assert entry["source"] == build.source_hash(variant)
    edited = tmp_path / "norm_add.comp"
    edited.write_text((SHADERS / "norm_add.comp").read_text() + "\n// an edit\n")
    monkeypatch.setattr(build, "HERE", tmp_path)
    (tmp_path / "common.glsl").write_text((SHADERS / "common.glsl").read_text())
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
