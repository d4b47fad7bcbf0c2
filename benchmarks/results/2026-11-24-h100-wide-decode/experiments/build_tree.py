"""Builds the named kernel variants from the working tree's shaders/ (as edited for an experiment)
into spv/LABEL_<name>.spv with their shipped defines (variants.VARIANTS); the experiment's diff
is kept beside as LABEL.diff (`git diff shaders/`).

    python build_tree.py LABEL name,name,...

Needs glslc (glslang on PATH for cooperative-matrix variants): run it here and carry spv/."""
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "shaders"))
from build import GLSLANG_FLAGS, GLSLC_FLAGS  # noqa: E402
from gemma_batch.backends.vulkan.variants import VARIANTS  # noqa: E402

if __name__ == "__main__":
    label, names = sys.argv[1], sys.argv[2].split(",")
    (HERE / "spv").mkdir(exist_ok=True)
    diff = subprocess.run(["git", "-C", str(ROOT), "diff", "shaders/"], check=True, capture_output=True, text=True).stdout
    (HERE / f"{label}.diff").write_text(diff)
    for name in names:
        v = VARIANTS[name]
        src, out = ROOT / "shaders" / f"{v.source}.comp", HERE / "spv" / f"{label}_{name}.spv"
        defines = [f"-D{d}" for d in v.defines]
        tool = ["glslang", *GLSLANG_FLAGS] if v.compiler == "glslang" else ["glslc", *GLSLC_FLAGS]
        subprocess.run([*tool, *defines, str(src), "-o", str(out)], check=True, stdout=subprocess.DEVNULL)
        print(f"{out.name}: {out.stat().st_size} B")
