"""Corrupt weights do not go silent: NaN or infinite logits stop the job with an error naming the
tensor (model/verify.py), no row is written from them, and `inspect --verify` finds the damage.

The damaged checkpoint is the issue's case: 50 KB of random bytes written inside one matrix of
the demo model, the file's size unchanged. Which tensor they land in is read off the file's
header here, independently of the code under test."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from gemma_batch.backends.base import NON_FINITE, SamplingBatch
from gemma_batch.backends.sampler import sample_tokens
from gemma_batch.job.spec import DEMO_MODEL
from tests.test_run_job import gemma_batch, write_jsonl

DAMAGED = "model.layers.2.mlp.gate_proj.weight"


def damage(tmp_path: Path, tensor: str = DAMAGED, nbytes: int = 50_000, seed: int = 64) -> Path:
    """A copy of the demo model with `nbytes` random bytes written inside `tensor`."""
    model = Path(shutil.copytree(DEMO_MODEL, tmp_path / "damaged"))
    path = model / "model.safetensors"
    with path.open("r+b") as f:
        header_len = struct.unpack("<Q", f.read(8))[0]
        begin, end = json.loads(f.read(header_len))[tensor]["data_offsets"]
        assert end - begin > nbytes
        f.seek(8 + header_len + begin + (end - begin - nbytes) // 2)
        f.write(np.random.default_rng(seed).bytes(nbytes))
    assert path.stat().st_size == (DEMO_MODEL / "model.safetensors").stat().st_size
    return model


def test_the_sampler_marks_rows_whose_logits_are_not_finite():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 50)).astype(np.float32)
    logits[1, 7] = np.nan
    logits[2, 30] = np.inf
    logits[3, :10] = -np.inf  # -inf is a logit a mask makes: fine
    logits[4, 0] = np.nan  # NaN behind the row's mask (bit 0 off): not looked at
    logits[5, 49] = np.nan
    greedy = sample_tokens(logits, None, np.arange(6))
    assert list(np.flatnonzero(greedy == NON_FINITE)) == [1, 2, 4, 5]  # (row 4 unmasked: its NaN counts)
    assert (greedy[[0, 3]] == np.argmax(logits[[0, 3]], axis=1)).all()
    allowed = np.full((6, 2), -1, np.int32)
    allowed[4, 0] = -2  # every id but 0
    sampling = SamplingBatch(np.float32([0, 0.8, 0, 1.0, 0.7, 1.2]), np.int32([0, 5, 0, 3, 0, 0]), np.ones(6, np.float32),
                             np.zeros(6, np.float32), np.zeros((6, 2), np.uint32), np.arange(6, dtype=np.uint32),
                             vocab_size=50, allowed=allowed)
    ids = sample_tokens(logits, sampling, np.arange(6))
    assert list(np.flatnonzero(ids == NON_FINITE)) == [1, 2, 5]
    assert ids[4] != NON_FINITE and ids[4] != 0


def test_a_damaged_matrix_stops_the_job_naming_it_and_writes_no_row(tmp_path):
    model = damage(tmp_path)
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "prompt": f"And God said {i}"} for i in range(4)])
    done = gemma_batch("run", src, "--model", model, "--backend", "cpu", "--max-tokens", "8")
    assert done.returncode == 1, done.stderr
    assert "NaN or infinite logits" in done.stderr and "checkpoint is damaged" in done.stderr
    assert f"layers.2.mlp.gate_proj.weight ({DAMAGED} in {model / 'model.safetensors'})" in done.stderr
    assert "RuntimeWarning" not in done.stderr  # numpy's noise gives way to the error
    assert not (tmp_path / "in.jsonl.completions.parquet").exists()
    partial = tmp_path / "in.jsonl.completions.parquet.partial" / "pending.jsonl"
    assert not partial.exists() or partial.read_text() == ""  # no row came from those logits

    verify = gemma_batch("inspect", model, "--verify")
    assert verify.returncode == 1 and f"damaged: layers.2.mlp.gate_proj.weight ({DAMAGED}" in verify.stdout
    assert "1 of 80 tensors" in verify.stderr
    clean = gemma_batch("inspect", DEMO_MODEL, "--verify")
    assert clean.returncode == 0 and "verified: all 80 tensors are finite" in clean.stdout


def test_choice_scores_from_non_finite_logits_stop_the_job(tmp_path):
    """A row answered by scoring its choices reads no sampled id: its scores are checked."""
    model = damage(tmp_path)
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "The sea"}])
    done = gemma_batch("run", src, "--model", model, "--backend", "cpu", "--choices", " yes, no", "--score-only")
    assert done.returncode == 1 and "NaN or infinite logits (row(s) 0)" in done.stderr, done.stderr


def test_on_vulkan_the_device_sampler_reports_them_too(tmp_path):
    from gemma_batch.backends.vulkan.device import VulkanUnavailable, list_devices

    try:
        list_devices()
    except VulkanUnavailable as e:
        pytest.skip(f"no Vulkan: {e}")
    model = damage(tmp_path)
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "prompt": "And God said"}, {"id": "b", "prompt": "The sea"}])
    done = gemma_batch("run", src, "--model", model, "--backend", "vulkan", "--max-tokens", "2", timeout=600)
    assert done.returncode == 1, done.stderr
    # Where the matrices go into fp16 tiles (cooperative matrices), the upload finds the NaNs
    # first, naming the tensor; elsewhere the sampler finds the logits they make.
    found = "NaN or infinite logits" in done.stderr or "NaN or infinite value(s): the checkpoint is damaged" in done.stderr
    assert found and "layers.2.mlp.gate_proj.weight" in done.stderr, done.stderr
    assert not (tmp_path / "in.jsonl.completions.parquet").exists()
    assert not (tmp_path / "in.jsonl.completions.parquet.partial").exists()
