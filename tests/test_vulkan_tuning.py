"""The prompt tile's forms and their tuning (backends/vulkan/tuning.py).

The cache logic runs anywhere, with the timing replaced by fixed figures. The forms' results run
only on a device with cooperative matrices: every form must give the prompt tile's bits exactly
(the same sums in the same order), so the tuner's choice can change speed alone.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

from typer.testing import CliRunner

from gemma_batch.backends.vulkan import tuning
from gemma_batch.backends.vulkan.coop_tiles import (COOP_FOLD_TILE_ROWS, COOP_WIDE_COLS, DEFAULT_PROMPT_FORM, PROMPT_FORMS,
                                                    coop_variant)
from gemma_batch.backends.vulkan.errors import DeviceMemoryError
from gemma_batch.backends.vulkan.kernels import Kernels
from gemma_batch.backends.vulkan.variants import VARIANTS
from gemma_batch.bench.shapes import shape_config
from gemma_batch.job.spec import DEMO_MODEL
from gemma_batch.model.config import Gemma3Config
from gemma_batch.cli import app
from tests.step_logits import assert_same_logits, keep_logits
from tests.test_vulkan_coopmat import _device_has_coopmat, needs_coopmat


def fake_kernels(coopmat: bool = True, x_lo: bool = False) -> SimpleNamespace:
    info = SimpleNamespace(name="Some GPU", driver="driver 1.0")
    return SimpleNamespace(dev=SimpleNamespace(coopmat=coopmat, info=info), x_lo=x_lo, fragment_loads=True, prompt_forms={})


def fixed_times(fastest: str):
    """A stand-in for time_forms: every form 2 ms but `fastest`, 1 ms; records the shapes asked."""
    asked = []

    def time_forms(kernels, mem, shapes):
        asked.extend(shapes)
        return {tuning.prompt_shape_key(*shape): {f: 1e-3 if f == fastest else 2e-3 for f in PROMPT_FORMS} for shape in shapes}
    return time_forms, asked


def test_every_form_is_the_prompt_tiles_size_and_compiled():
    """Each form covers 128 outputs x 128 rows (what the host's grid assumes), in whole stages, and
    has a compiled variant, plain and gated."""
    for form, defines in PROMPT_FORMS.items():
        d = {k: int(v) for k, v in (x.split("=") for x in defines)}
        assert 16 * d["SG_N"] * d["TN"] == COOP_WIDE_COLS and 16 * d["SG_M"] * d["TM"] == COOP_FOLD_TILE_ROWS, form
        assert 64 % d["KU"] == 0 and d["SG_N"] * d["SG_M"] in (8, 16), form
        for gemm in ((), ("GATED",)):
            variant = VARIANTS[coop_variant(gemm, "T16", "wide", whole=True, form=form)]
            assert variant.spv.is_file() and "WHOLE_K" in variant.defines, variant.name


def test_the_model_shapes_are_its_wide_matmuls():
    cfg = shape_config("4b")
    assert tuning.model_shapes(cfg) == [(4096, 2560, False), (2560, 2048, False), (20480, 2560, True), (2560, 10240, False)]


def test_choices_are_timed_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(tuning.TUNE_ENV, raising=False)
    cfg = shape_config("4b")
    timer, asked = fixed_times("8x1")
    monkeypatch.setattr(tuning, "time_forms", timer)
    kernels = tuning.tuned(fake_kernels(), None, cfg, tmp_path)
    assert asked == tuning.model_shapes(cfg)
    assert kernels.prompt_forms == {tuning.prompt_shape_key(*s): "8x1" for s in asked}
    assert Kernels.prompt_form(kernels, 20480, 2560, True) == "8x1"
    assert Kernels.prompt_form(kernels, 20480, 2560, False) == DEFAULT_PROMPT_FORM  # (not a shape it timed)
    kept = json.loads((tmp_path / tuning.FILE).read_text())
    assert list(kept) == [tuning.device_key(kernels)] and len(kept[tuning.device_key(kernels)]) == 4

    asked.clear()
    again = tuning.tuned(fake_kernels(), None, cfg, tmp_path)
    assert asked == [] and again.prompt_forms == kernels.prompt_forms

    other = shape_config("1b")  # another model: only its new shapes are timed, and the file keeps both
    tuning.tuned(fake_kernels(), None, other, tmp_path)
    assert asked and all(tuning.prompt_shape_key(*s) not in kernels.prompt_forms for s in asked)
    assert len(json.loads((tmp_path / tuning.FILE).read_text())[tuning.device_key(kernels)]) == 4 + len(asked)


def test_the_default_form_is_not_listed_and_other_drivers_are_apart(tmp_path, monkeypatch):
    monkeypatch.delenv(tuning.TUNE_ENV, raising=False)
    timer, asked = fixed_times(DEFAULT_PROMPT_FORM)
    monkeypatch.setattr(tuning, "time_forms", timer)
    assert tuning.tuned(fake_kernels(), None, shape_config("4b"), tmp_path).prompt_forms == {}
    newer = fake_kernels()
    newer.dev.info.driver = "driver 2.0"
    asked.clear()
    tuning.tuned(newer, None, shape_config("4b"), tmp_path)
    assert len(asked) == 4  # a new driver is timed afresh


def test_choices_made_with_other_kernels_or_rows_are_timed_again(tmp_path, monkeypatch):
    """A choice is kept for the forms' SPIR-V and the rows they were timed at: a new build of a
    form's kernel, or another TUNE_ROWS, makes the device's first job time them again."""
    monkeypatch.delenv(tuning.TUNE_ENV, raising=False)
    timer, asked = fixed_times("8x1")
    monkeypatch.setattr(tuning, "time_forms", timer)
    tuning.tuned(fake_kernels(), None, shape_config("4b"), tmp_path)
    assert len(asked) == 4 and f"at {tuning.TUNE_ROWS} rows" in tuning.device_key(fake_kernels())
    asked.clear()
    monkeypatch.setattr(tuning, "TUNE_ROWS", tuning.TUNE_ROWS // 4)
    tuning.tuned(fake_kernels(), None, shape_config("4b"), tmp_path)
    assert len(asked) == 4
    asked.clear()
    name = coop_variant(("GATED",), "T16", "wide", whole=True, form="2x4")
    rebuilt = tmp_path / "rebuilt.spv"
    rebuilt.write_bytes(VARIANTS[name].spv.read_bytes() + bytes(4))
    monkeypatch.setitem(VARIANTS, name, SimpleNamespace(spv=rebuilt))
    tuning.tuned(fake_kernels(), None, shape_config("4b"), tmp_path)
    assert len(asked) == 4
    assert len(json.loads((tmp_path / tuning.FILE).read_text())) == 3  # each kept apart


def test_a_damaged_file_is_timed_again_and_rewritten(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(tuning.TUNE_ENV, raising=False)
    (tmp_path / tuning.FILE).write_text('{"Some GPU | driver 1.0 | fragment order on": {"4096 x 2560": ')
    timer, asked = fixed_times("2x4")
    monkeypatch.setattr(tuning, "time_forms", timer)
    kernels = tuning.tuned(fake_kernels(), None, shape_config("4b"), tmp_path, log=sys.stderr)
    assert len(asked) == 4 and set(kernels.prompt_forms.values()) == {"2x4"}
    assert "could not be read" in capsys.readouterr().err
    assert json.loads((tmp_path / tuning.FILE).read_text())  # whole again


def test_nothing_is_timed_when_switched_off_without_a_cache_or_where_it_does_not_apply(tmp_path, monkeypatch):
    def refuse(*args):
        raise AssertionError("timed")
    monkeypatch.setattr(tuning, "time_forms", refuse)
    cfg = shape_config("4b")
    monkeypatch.setenv(tuning.TUNE_ENV, "0")
    assert tuning.tuned(fake_kernels(), None, cfg, tmp_path).prompt_forms == {}
    monkeypatch.delenv(tuning.TUNE_ENV)
    assert tuning.tuned(fake_kernels(), None, cfg, None).prompt_forms == {}  # GEMMA_BATCH_CACHE_DIR=off
    assert tuning.tuned(fake_kernels(coopmat=False), None, cfg, tmp_path).prompt_forms == {}
    assert tuning.tuned(fake_kernels(x_lo=True), None, cfg, tmp_path).prompt_forms == {}  # split inputs: another tile
    assert not (tmp_path / tuning.FILE).exists()


def test_a_device_short_of_memory_runs_the_default_form(tmp_path, monkeypatch, capsys):
    def short(*args):
        raise DeviceMemoryError("out of device memory")
    monkeypatch.delenv(tuning.TUNE_ENV, raising=False)
    monkeypatch.setattr(tuning, "time_forms", short)
    assert tuning.tuned(fake_kernels(), None, shape_config("4b"), tmp_path, log=sys.stderr).prompt_forms == {}
    assert "not timed (out of device memory)" in capsys.readouterr().err and not (tmp_path / tuning.FILE).exists()


def test_a_cache_that_cannot_be_written_does_not_stop_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(tuning.TUNE_ENV, raising=False)
    timer, asked = fixed_times("8x1")
    monkeypatch.setattr(tuning, "time_forms", timer)
    (tmp_path / "cache").write_text("a file where the cache folder should be")
    kernels = tuning.tuned(fake_kernels(), None, shape_config("4b"), tmp_path / "cache", log=sys.stderr)
    assert set(kernels.prompt_forms.values()) == {"8x1"} and "could not be kept" in capsys.readouterr().err


def test_the_table_marks_the_fastest():
    table = tuning.format_times({"4096 x 2560": {f: (1e-3 if f == "4x2k16" else 2e-3) for f in PROMPT_FORMS}})
    assert table.splitlines()[1].endswith("4x2k16") and "1.000*" in table and table.count("*") == 1


def test_the_tune_command(tmp_path, monkeypatch):
    """`gemma-batch tune --shape 1b` prints the table and keeps it where the device has cooperative
    matrices, and says there is nothing to tune where it has none; a model or a shape is needed."""
    monkeypatch.setenv("GEMMA_BATCH_CACHE_DIR", str(tmp_path))
    runner = CliRunner()
    assert runner.invoke(app, ["tune"]).exit_code == 2
    result = runner.invoke(app, ["tune", "--shape", "1b"])
    assert result.exit_code == 0, result.output
    if _device_has_coopmat():
        assert "fastest" in result.output and f"kept in {tmp_path / tuning.FILE}" in result.output
        (entries,) = json.loads((tmp_path / tuning.FILE).read_text()).values()
        assert set(entries) == {tuning.prompt_shape_key(*s) for s in tuning.model_shapes(shape_config("1b"))}
    else:
        assert "nothing to tune" in result.output and not (tmp_path / tuning.FILE).exists()


@needs_coopmat
def test_every_form_gives_the_prompt_tiles_bits(monkeypatch):
    """The demo model's logits over two prompts of 297 and 193 tokens (fp16 inputs, the 128-row
    form), with every matmul's prompt tile in each form, equal the default form's bit for bit; the
    form asked is the one that ran."""
    from gemma_batch.backends.vulkan import VulkanBackend, grids
    from gemma_batch.engine.generate import generate_greedy
    from gemma_batch.model.checkpoint import Checkpoint

    monkeypatch.setattr(grids, "coop_whole_small", lambda rows, tiles, sms: False)
    monkeypatch.setenv(tuning.TUNE_ENV, "0")
    cfg = Gemma3Config.from_dir(DEMO_MODEL)
    runs = {}
    for form in PROMPT_FORMS:
        monkeypatch.setattr(Kernels, "prompt_form", lambda self, N, K, gated, form=form: form)
        backend = VulkanBackend(cfg, kv_dtype="fp16", profile=True)
        backend.load_weights(Checkpoint.open(DEMO_MODEL, cfg).tensors())
        rows, ran = {}, set()

        def record(ids, batch, result, rows=rows, ran=ran, backend=backend):
            ran.update(backend.profile_seconds())
            keep_logits(rows, ids, batch, result)
        generate_greedy(backend, [list(range(3, 300)), list(range(7, 200))], 3, step_token_budget=512, on_step=record)
        backend.close()
        assert {coop_variant(g, "T16", "wide", whole=True, form=form) for g in ((), ("GATED",))} <= ran, form
        runs[form] = rows
    for form, rows in runs.items():
        assert_same_logits(rows, runs[DEFAULT_PROMPT_FORM], form)


@needs_coopmat
def test_a_backend_times_its_shapes_once(tmp_path, monkeypatch):
    """The first backend on the device times the demo model's shapes and keeps them; the next
    reads them."""
    from gemma_batch.backends.vulkan import VulkanBackend

    monkeypatch.setenv("GEMMA_BATCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(tuning.TUNE_ENV, raising=False)
    cfg = Gemma3Config.from_dir(DEMO_MODEL)
    timed = []
    real = tuning.time_forms
    monkeypatch.setattr(tuning, "time_forms", lambda *a, **k: timed.append(1) or real(*a, **k))
    VulkanBackend(cfg, kv_dtype="fp16").close()
    kept = json.loads((tmp_path / tuning.FILE).read_text())
    (entries,) = kept.values()
    assert set(entries) == {tuning.prompt_shape_key(*s) for s in tuning.model_shapes(cfg)}
    assert all(set(e["ms"]) == set(PROMPT_FORMS) and e["form"] in PROMPT_FORMS for e in entries.values())
    VulkanBackend(cfg, kv_dtype="fp16").close()
    assert timed == [1]
