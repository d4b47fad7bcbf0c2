"""int4's calibration pass (quantize/calibration.py) and the rounding it weighs (model/quant.py).

The pass's mean squares are checked against transformers' own activations, taken by hooks on the
inputs of the same Linear modules over the same windows. Both sides compute in float32 (the
logits of test_cpu_vs_transformers agree within 1e-4 on this model); a mean square over ~30
tokens then agrees within 1e-4 relative, while a layer, a window or a norm got wrong moves it by
percents (the negative control).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gemma_batch.job.spec import DEMO_MODEL
from gemma_batch.model.checkpoint import Checkpoint
from gemma_batch.model.config import Gemma3Config
from gemma_batch.model.quant import WeightFormat, quantize
from gemma_batch.model.quant_cache import load_converted
from gemma_batch.model.tokenizer import Tokenizer
from gemma_batch.quantize import calibration
from gemma_batch.quantize.calibration import BUNDLED_TEXT, TEXT_SWITCH, Calibration, int4_calibration
from tests.tiny_models import make_causal_lm

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Two windows, both longer than the tiny model's sliding window (8): 21 and 14 tokens.
WINDOWS = ((2, *[(i * 37) % 290 + 5 for i in range(20)]), (2, *[(i * 11) % 250 + 40 for i in range(13)]))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny") / "causal"
    model = make_causal_lm(folder)
    cfg = Gemma3Config.from_dir(folder)
    return Checkpoint.open(folder, cfg), cfg, model


def transformers_mean_squares(model, windows) -> dict[str, np.ndarray]:
    sums: dict[str, torch.Tensor] = {}

    def hook(name):
        def record(module, args):
            x = args[0][0].double()  # [T, K]
            sums[name] = sums.get(name, 0) + (x * x).sum(0)
        return record

    hooks = [m.register_forward_pre_hook(hook(name)) for name, m in model.named_modules() if name.endswith(PROJECTIONS)]
    try:
        with torch.no_grad():
            for window in windows:
                model(input_ids=torch.tensor([window]))
    finally:
        for h in hooks:
            h.remove()
    tokens = sum(len(w) for w in windows)
    return {name.removeprefix("model.") + ".weight": (s / tokens).numpy() for name, s in sums.items()}


@pytest.mark.parametrize("windows_a_step", [1, 4])
def test_channel_weights_are_the_mean_squares_transformers_feeds_each_matrix(tiny, monkeypatch, windows_a_step):
    checkpoint, cfg, model = tiny
    monkeypatch.setattr(calibration, "WINDOWS_A_STEP", windows_a_step)  # (1: each window a step of its own)
    ours = Calibration(cfg, WINDOWS, "test").channel_weights(checkpoint)
    theirs = transformers_mean_squares(model, WINDOWS)
    assert set(ours) == set(theirs) and len(ours) == 7 * cfg.num_layers
    for name, expected in theirs.items():
        np.testing.assert_allclose(ours[name], expected, rtol=1e-4, err_msg=name)
    # Negative control: the same text as one window of 35 (keys cross the windows' border) moves them by far more.
    merged = Calibration(cfg, (WINDOWS[0] + WINDOWS[1][1:],), "test").channel_weights(checkpoint)
    worst = max(np.abs(merged[n] / theirs[n] - 1).max() for n in theirs if "o_proj" in n)
    assert worst > 1e-2


def test_the_weighted_grid_keeps_heavily_used_channels_closer():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    d = np.where(np.arange(256) % 8 == 0, 1000.0, 1.0).astype(np.float32)  # every 8th channel carries large inputs
    fmt = WeightFormat.parse("int4")

    def weighted_error(q):
        return float((d * (q.dequantize() - w) ** 2).sum())

    plain, weighted = quantize(w, fmt), quantize(w, fmt, d)
    assert weighted_error(weighted) < 0.7 * weighted_error(plain)
    # Equal weights fit the same grid as none, bit for bit (the fit divides by the group's largest).
    same = quantize(w, fmt, np.full(256, 3.0, np.float32))
    assert np.array_equal(same.q, plain.q) and np.array_equal(same.scales, plain.scales)


def test_int4_conversion_is_cached_per_calibration_text(tiny, tmp_path, monkeypatch):
    checkpoint, cfg, _ = tiny
    fmt = WeightFormat.parse("int4")
    first = Calibration(cfg, WINDOWS, "first")
    second = Calibration(cfg, WINDOWS[:1], "second")

    def load(calibration):
        loaded = load_converted(checkpoint, fmt, tmp_path, calibration)
        return dict(loaded.tensors), loaded.note

    a, note = load(first)
    assert "weighted by 35 tokens of first" in note[0]
    again, note = load(first)
    assert "read from the cache" in note[0]
    b, _ = load(second)
    plain, _ = load(None)
    name = "layers.2.mlp.down_proj.weight"
    assert np.array_equal(again[name].q, a[name].q)
    assert not np.array_equal(b[name].scales, a[name].scales)
    assert not np.array_equal(plain[name].scales, a[name].scales)
    assert len(list((tmp_path / "weights").glob("*.safetensors"))) == 3


def test_the_calibration_text_is_chosen_by_the_switch(tmp_path, monkeypatch):
    tokenizer, cfg = Tokenizer.from_dir(DEMO_MODEL), Gemma3Config.from_dir(DEMO_MODEL)
    monkeypatch.delenv(TEXT_SWITCH, raising=False)
    bundled = int4_calibration(WeightFormat.parse("int4"), tokenizer, cfg)
    assert bundled.source == "the bundled text" and bundled.tokens > 1000
    assert all(w[0] == Tokenizer.BOS_ID and len(w) <= 512 for w in bundled.windows)
    assert int4_calibration(WeightFormat.parse("int8"), tokenizer, cfg) is None
    text = tmp_path / "mine.txt"
    text.write_text("In the beginning was the word. " * 40)
    monkeypatch.setenv(TEXT_SWITCH, str(text))
    mine = int4_calibration(WeightFormat.parse("int4"), tokenizer, cfg)
    assert mine.source == str(text) and mine.key != bundled.key
    monkeypatch.setenv(TEXT_SWITCH, "off")
    assert int4_calibration(WeightFormat.parse("int4"), tokenizer, cfg) is None
    monkeypatch.setenv(TEXT_SWITCH, str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="missing.txt"):
        int4_calibration(WeightFormat.parse("int4"), tokenizer, cfg)
    assert BUNDLED_TEXT.stat().st_size > 4000
