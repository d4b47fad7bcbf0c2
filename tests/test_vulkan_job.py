"""The Vulkan backend behind the command line: device listing, `run --backend vulkan`, `auto`,
and the failures a user can meet (no driver, no such device, not enough device memory)."""

from __future__ import annotations

import dataclasses
import io
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gemma_batch.backends import resolve_backend
from gemma_batch.backends.vulkan import DeviceMemoryError, VulkanBackend, VulkanUnavailable
from gemma_batch.backends.vulkan import device as vk_device
from gemma_batch.job.runner import JobFailed, run_job
from gemma_batch.job.spec import make_spec
from tests.test_run_job import SAMPLES, gemma_batch

NO_DRIVER = {"VK_DRIVER_FILES": "/nonexistent/icd.json", "VK_ICD_FILENAMES": "/nonexistent/icd.json"}


@pytest.fixture()
def sample_jsonl(tmp_path) -> Path:
    return Path(shutil.copy(SAMPLES / "prompts.jsonl", tmp_path / "prompts.jsonl"))


def test_devices_lists_each_device_with_its_capabilities():
    done = gemma_batch("devices")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("[0] ")
    for field in ("driver", "memory heaps", "fp16", "int8", "bf16", "subgroup", "cooperative matrix"):
        assert field in done.stdout


@pytest.mark.parametrize("flags", [(), ("--regex", "[A-Z][a-z]{2,9}(, [A-Z][a-z]{2,9})?")])
def test_run_on_vulkan_gives_the_cpu_completions(tmp_path, sample_jsonl, flags):
    outputs = {}
    for backend in ("cpu", "vulkan"):
        out = tmp_path / f"{backend}.parquet"
        done = gemma_batch("run", sample_jsonl, "--backend", backend, "--max-tokens", "24", "--output", out, *flags)
        assert done.returncode == 0, done.stderr
        outputs[backend] = pq.read_table(out).to_pylist()
        assert f"backend: {backend}" in done.stderr
    assert [r["completion"] for r in outputs["vulkan"]] == [r["completion"] for r in outputs["cpu"]]
    if flags:  # a grammar: the Vulkan sampler applied its masks
        assert all(re.fullmatch(flags[1], r["completion"]) for r in outputs["vulkan"])
    stats = pq.read_table(tmp_path / "vulkan.stats.parquet").to_pylist()[0]
    assert stats["backend"].startswith("vulkan on ")  # the device is part of the job's identity


def test_without_a_driver_vulkan_fails_clearly_and_auto_falls_back_to_cpu(tmp_path, sample_jsonl, monkeypatch):
    out = tmp_path / "out.parquet"
    for key, value in NO_DRIVER.items():
        monkeypatch.setenv(key, value)
    done = gemma_batch("run", sample_jsonl, "--backend", "vulkan", "--output", out)
    auto = gemma_batch("run", sample_jsonl, "--output", tmp_path / "auto.parquet", "--max-tokens", "4")
    assert done.returncode == 1
    assert "--backend cpu" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()
    assert auto.returncode == 0, auto.stderr
    assert "backend: cpu (auto: no Vulkan" in auto.stderr


def test_an_unknown_device_is_named_with_the_devices_there_are(tmp_path, sample_jsonl):
    done = gemma_batch("run", sample_jsonl, "--backend", "vulkan", "--device", "no-such-gpu", "--output", tmp_path / "o.parquet")
    assert done.returncode == 1
    assert "no Vulkan device matches 'no-such-gpu'" in done.stderr and "[0] " in done.stderr


def test_device_memory_running_out_at_load_fails_the_job_and_leaves_nothing(tmp_path, sample_jsonl, monkeypatch):
    def no_room(self, num_blocks, block_size):
        raise DeviceMemoryError("allocation of 9.00 GiB for layer 0 K pages failed on TEST: 1.00 GiB free; "
                                "use a smaller --kv-memory or --backend cpu")

    monkeypatch.setattr(VulkanBackend, "allocate_kv", no_room)
    out = tmp_path / "out.parquet"
    spec = make_spec({"input": sample_jsonl, "backend": "vulkan", "output": out})
    with pytest.raises(JobFailed, match="smaller --kv-memory or --backend cpu"):
        run_job(spec, log=io.StringIO(), out=io.StringIO())
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()


def test_weights_larger_than_the_device_fail_before_anything_is_written(tmp_path, sample_jsonl, monkeypatch):
    monkeypatch.setattr(VulkanBackend, "available_memory", lambda self: 1024)
    out = tmp_path / "out.parquet"
    spec = make_spec({"input": sample_jsonl, "backend": "vulkan", "output": out})
    with pytest.raises(JobFailed, match=r"weights take .* GiB on the vulkan backend .*--backend cpu"):
        run_job(spec, log=io.StringIO(), out=io.StringIO())
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()


def test_too_large_kv_allocation_names_the_buffer_and_what_to_do():
    from gemma_batch.job.spec import DEMO_MODEL
    from gemma_batch.model.config import Gemma3Config

    backend = VulkanBackend(Gemma3Config.from_dir(DEMO_MODEL))
    with pytest.raises(DeviceMemoryError, match=r"layer \d+ K pages.*exceeds.*largest storage buffer.*smaller --kv-memory or --backend cpu"):
        backend.allocate_kv({"full_attention": 10**7, "sliding_attention": 10**7}, 16)


def test_a_device_too_small_for_the_shaders_is_refused_by_name_and_skipped_by_auto(monkeypatch):
    """The sampler needs 1024-invocation workgroups; a device offering 256 (real on some mobile
    GPUs) is refused before any allocation, and `auto` does not pick it."""
    real = vk_device.list_devices()
    assert all(not d.shortfalls() for d in real)  # the device under test can run everything
    small = [dataclasses.replace(d, max_workgroup_invocations=256, type_code=2, type="discrete GPU") for d in real]
    assert small[0].shortfalls() == ["workgroups of 1024 invocations (has 256)"]
    assert "cannot run gemma-batch: lacks workgroups of 1024" in small[0].describe()
    monkeypatch.setattr(vk_device, "list_devices", lambda: small)
    monkeypatch.setattr(vk_device, "describe_device", lambda vk, instance, i, pd: small[i])
    assert resolve_backend("auto") == ("cpu", f"auto: Vulkan GPU {small[0].name} lacks workgroups of 1024 invocations (has 256)")
    with pytest.raises(VulkanUnavailable, match="cannot run the shaders: it lacks workgroups of 1024.*--backend cpu"):
        vk_device.Device()
