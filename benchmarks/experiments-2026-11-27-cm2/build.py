"""Build gemm_cm2.comp's variants to .exp/cm2/cm2t_<WG>_<BM>x<BN>x<BK>[_g<GM>][_spec].spv; spirv-val them.

    .venv/bin/python .exp/cm2/build.py [--dis]     # --dis also writes the .spvasm beside each

SPIR-V 1.6 (what glslang --target-env vulkan1.3 gives; ggml builds its _cm2 shaders so).
"""

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from glslang_slang import compile_glsl, disassemble, validate  # noqa: E402

# (WG, BM, BN, BK, GM, SPEC_MNK): the five asked for (ggml's tile order, M, N, K pushed), then
# two with grouped tile order (GM = 8) and one with M, N, K as specialization constants
VARIANTS = [(256, 128, 256, 64, 0, False), (256, 128, 128, 64, 0, False), (256, 128, 128, 32, 0, False),
            (128, 64, 64, 64, 0, False), (256, 256, 128, 64, 0, False),
            (256, 128, 256, 64, 8, False), (256, 128, 128, 64, 8, False), (256, 128, 256, 64, 0, True)]


def name(wg: int, bm: int, bn: int, bk: int, gm: int, spec: bool) -> str:
    return f"cm2t_{wg}_{bm}x{bn}x{bk}" + (f"_g{gm}" if gm else "") + ("_spec" if spec else "") + ".spv"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dis", action="store_true")
    args = ap.parse_args()
    src = HERE / "gemm_cm2.comp"
    text = src.read_text()
    bad = 0
    for wg, bm, bn, bk, gm, spec in VARIANTS:
        out = HERE / name(wg, bm, bn, bk, gm, spec)
        defines = {"WG": wg, "BM": bm, "BN": bn, "BK": bk, "GM": gm, **({"SPEC_MNK": 1} if spec else {})}
        code = compile_glsl(text, defines, str(src), (1, 6))
        out.write_bytes(code)
        msg = validate(out, "vulkan1.3")
        print(f"{out.name}: {len(code)} bytes, spirv-val {msg or 'ok'}")
        bad += msg is not None
        if args.dis:
            out.with_suffix(".spvasm").write_text(disassemble(out))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
