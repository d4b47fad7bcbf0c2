"""Builds kernel variants from a patched copy of shaders/: for each LABEL.diff given, shaders/ as
of BASE (the commit the diffs were made against) is written to a temporary folder, the diff
applied there (patch -p1, paths as in `git diff`), and the named variants compiled with their
shipped defines (kernels.VARIANTS) into spv/LABEL_<name>.spv.

    python build_variants.py LABEL.diff name,name,... [OUT_LABEL DEFINE,DEFINE,...]

(the optional pair: more defines, and the label the files get instead of the diff's).

Needs glslc (and glslang on PATH for cooperative-matrix variants), so run it here and carry spv/."""
import io
import subprocess
import tarfile
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "shaders"))
from build import GLSLANG_FLAGS, GLSLC_FLAGS  # noqa: E402
from gemma_batch.backends.vulkan.kernels import VARIANTS  # noqa: E402

BASE = "7f38140"  # before fdff182 specialised attention's sizes


def main() -> None:
    diff, names = Path(sys.argv[1]), sys.argv[2].split(",")
    label = sys.argv[3] if len(sys.argv) > 3 else diff.stem
    extra = [f"-D{d}" for d in sys.argv[4].split(",")] if len(sys.argv) > 4 else []
    (HERE / "spv").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", BASE, "shaders"], check=True, capture_output=True).stdout
        tarfile.open(fileobj=io.BytesIO(archive)).extractall(tree, filter="data")
        subprocess.run(["patch", "-s", "-p1", "-i", str(diff.resolve())], cwd=tree, check=True)
        for name in names:
            v = VARIANTS[name]
            src, out = tree / "shaders" / f"{v.source}.comp", HERE / "spv" / f"{label}_{name}.spv"
            defines = [f"-D{d}" for d in v.defines] + extra
            if v.compiler == "glslang":
                cmd = ["glslang", *GLSLANG_FLAGS, *defines, str(src), "-o", str(out)]
            else:
                cmd = ["glslc", *GLSLC_FLAGS, *defines, str(src), "-o", str(out)]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            print(f"{out.name}: {out.stat().st_size} B")


if __name__ == "__main__":
    main()
