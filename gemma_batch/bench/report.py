"""The benchmark report as a table for people and as JSON for tools (`run_bench`'s dict, as is)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from ..model.config import SLIDING
from .metrics import SLOW_STEP

# (heading, how to show a case; None -> "n/a")
Column = tuple[str, Callable[[dict], str]]


def _num(key: str, scale: float = 1.0, digits: int = 1, unit: str = "") -> Callable[[dict], str]:
    def show(case: dict) -> str:
        value = case[key]
        return "n/a" if value is None else f"{value * scale:,.{digits}f}{unit}"
    return show


def _slow(case: dict) -> str:
    """"3 (1 device)": slow decode steps, and how many of them the device itself was slow in."""
    on_device = case["slow_decode_steps_on_device"]
    return str(case["slow_decode_steps"]) + ("" if on_device is None else f" ({on_device} device)")


def binary_size(nbytes: float) -> str:
    """1536 -> "1.5 KiB": sizes in binary units (rates in decimal ones: GB/s)."""
    value, unit = float(nbytes), "B"
    for larger in ("KiB", "MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{value:.1f} {unit}"


COLUMNS: list[Column] = [
    ("batch", lambda c: str(c["batch"])),
    ("prefill tok/s", _num("prefill_tokens_per_s")),
    ("prefill TFLOP/s", _num("prefill_tflops", digits=1)),
    ("TTFT mean ms", _num("ttft_mean_s", 1000)),
    ("TTFT max ms", _num("ttft_max_s", 1000)),
    ("decode tok/s", _num("decode_tokens_per_s")),
    ("e2e tok/s", _num("e2e_tokens_per_s")),
    ("step ms", _num("decode_step_ms_median", digits=2)),
    ("mean step ms", _num("decode_step_ms_mean", digits=2)),
    ("slow steps", _slow),
    ("device ms", _num("decode_device_ms_median", digits=2)),
    ("host ms", _num("host_ms_per_decode_step", digits=2)),
    ("host %", _num("host_percent_of_device")),
    ("peak memory", lambda c: binary_size(c["peak_memory_bytes"])),
    ("roofline tok/s", _num("roofline_decode_tokens_per_s")),
    ("bw fraction", _num("bandwidth_fraction", 100, unit="%")),
]


def format_table(report: dict) -> str:
    """A header that states the conditions (device, shape, weight format, KV dtype, lengths, bandwidth),
    then one row per case."""
    run, cases = report["run"], report["cases"]
    cfg = run["config"]
    windows = "" if SLIDING not in run["kv_bytes_per_token"] else f", window {cfg['sliding_window']}"
    first = cases[0]  # every case has the same lengths
    header = [
        f"{'model' if run.get('weights_source') == 'checkpoint' else 'shape'} {run['shape']} ({cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
        f"{cfg['num_attention_heads']}/{cfg['num_key_value_heads']} heads of {cfg['head_dim']}, "
        f"vocab {cfg['vocab_size']}{windows}), {run.get('weights_source', 'random')} {run['weights']} weights ({_by_kind(run)}) "
        f"loaded in {run['weight_load_s']:.1f} s; KV cache {run['kv_dtype']}",
        f"device: {run['backend']}; {run['backend_choice']}",
        f"measured read bandwidth: {run['bandwidth_bytes_per_s'] / 1e9:,.1f} GB/s "
        f"(streaming read of {binary_size(run['bandwidth_test_bytes'])})",
        f"each case: batch requests of {first['prompt_len']} prompt tokens, {first['gen_len']} generated "
        f"(greedy); decode figures over decode-only steps (step times: medians, but decode tok/s is over the "
        f"mean step; slow steps: over {SLOW_STEP}x the median step, and of them slow on the device too); "
        f"roofline: weights ({run['weights']}) + KV ({run['kv_dtype']}) read per step at the measured bandwidth",
    ]
    rows = [[heading for heading, _ in COLUMNS]] + [[show(case) for _, show in COLUMNS] for case in cases]
    return "\n".join([*header, "", *align(rows)])


def _by_kind(run: dict) -> str:
    """The weights' bytes, by storage kind where there are several: "1.2 GiB: INT4 1.0 GiB, INT8 204.8 MiB, ..."."""
    kinds = sorted(run["weight_bytes_by_dtype"].items(), key=lambda kv: -kv[1])
    if len(kinds) == 1:
        return binary_size(run["weight_bytes"])
    return f"{binary_size(run['weight_bytes'])}: " + ", ".join(f"{kind} {binary_size(n)}" for kind, n in kinds)


def align(rows: list[list[str]]) -> list[str]:
    """Rows of cells as lines, each column right-aligned to its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]


def write_json(report: dict, path: Path) -> None:
    """The report as indented JSON (None -> null)."""
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
