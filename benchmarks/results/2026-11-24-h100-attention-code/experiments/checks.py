"""The driver's storage-buffer bounds checks (its default) against none (robustness.py, the
engine's default where the device has VK_EXT_pipeline_robustness): each decode-step kernel's
registers and binary size both ways; then, on one 4b backend, each build's logits hashes (they
must agree: only the checks differ) and its median decode step at batch 1 and 32, the builds
alternating, three rounds (the code-size folder's builds.alternate_settings).

    python3 checks.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "2026-11-24-h100-code-size/experiments"))
from builds import Device, Kmod, alternate_settings, pipeline_stats, shape_config  # noqa: E402

KERNELS = [("attention_float16_split_qk", (256, 8, 4, 16, 64, 8)), ("attention_float16_split", ()),
           ("coop_t16", ()), ("coop_gated_t16", ()), ("coop_rows_t16", ()), ("reduce_post_norm_split", ()),
           ("reduce_gated_split", ()), ("reduce_gated_split_rows", ()), ("reduce_rows", ()), ("sample", ()),
           ("split_norm", ()), ("embed_t16", ())]


def stats() -> None:
    dev = Device(capture_statistics=True)
    print(f"device built with per-pipeline robustness: {dev.unchecked}", flush=True)
    kernels = Kmod.Kernels.for_model(dev, shape_config("4b"))
    for name, special in KERNELS:
        row = []
        for unchecked in (False, True):
            dev.unchecked = unchecked
            kernels.pipelines.clear()
            build = kernels.pipeline
            kernels.pipeline = lambda n, _s=(), v=special: build(n, v)
            s = pipeline_stats.statistics(kernels, name)
            del kernels.pipeline
            row.append(f"{s.get('Register Count')} registers, {s.get('Binary Size')} B")
        print(f"{name:28s} checked: {row[0]:28s} unchecked: {row[1]}", flush=True)
    kernels.close()
    dev.close()


def checks(unchecked: bool):
    def setup(backend) -> None:
        backend.kernels.dev.unchecked = unchecked
        backend.kernels.pipelines.clear()  # (leaks the old pipelines: fine for an experiment)
    return setup


if __name__ == "__main__":
    stats()
    alternate_settings([("unchecked", checks(True)), ("checked", checks(False))])
