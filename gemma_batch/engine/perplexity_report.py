"""`gemma-batch perplexity`'s run: a text file scored by a loaded model (`perplexity.py`), against
a reference where one is given, as a report (JSON-ready dict) and a summary.

The report (`--json`) has the figures (`perplexity`, `tokens`, `windows`, `weights`, `kv_dtype`,
`backend`, `model`, `context`, `stride`, `seconds`, `reference` with `perplexity`, `change`,
`top1_agreement`, `mean_kl`) and, per scored token, what a later run compares against:
`token_ids`, `token_logprobs`, `top_ids` and `top_logprobs` (`top_k` of them).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from .llm import LLM
from .perplexity import TokenScores, compare, score_windows, text_windows

REPORT_VERSION = 1


@dataclass(frozen=True)
class Settings:
    """How a text is cut and scored; a reference must have been run with the same cut."""

    context: int = 512
    stride: int = 512
    top_k: int = 10
    max_batch: int = 8
    step_tokens: int = 256


@dataclass(frozen=True)
class Reference:
    """What a run is compared against: an earlier report's tokens and top-k."""

    source: str  # the report file, or the model and format run as the reference
    report: dict

    @classmethod
    def load(cls, path: Path) -> Reference:
        """An earlier `--json` report; ValueError naming the file if it is not one."""
        try:
            report = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"reference {path}: cannot read it as a perplexity report ({e})") from None
        if not isinstance(report, dict) or report.get("report_version") != REPORT_VERSION or "top_ids" not in report:
            raise ValueError(f"reference {path}: not a report of `gemma-batch perplexity --json` (version "
                             f"{REPORT_VERSION})")
        return cls(str(path), report)

    @cached_property
    def top_ids(self) -> np.ndarray:
        """[N, K] int64: the reference's most likely tokens at each scored token."""
        return np.asarray(self.report["top_ids"], np.int64)

    def check(self, token_ids: list[int], settings: Settings) -> None:
        """ValueError unless the reference scored these very tokens, cut the same way."""
        r = self.report
        if (r["context"], r["stride"]) != (settings.context, settings.stride):
            raise ValueError(f"reference {self.source} was cut with --context {r['context']} --stride {r['stride']}, "
                             f"this run with --context {settings.context} --stride {settings.stride}")
        if r["token_ids"] != token_ids:
            raise ValueError(f"reference {self.source} scored other tokens ({len(r['token_ids'])} against "
                             f"{len(token_ids)}): another text or another tokenizer")


def text_ids(llm: LLM, text_file: Path) -> tuple[list[int], str]:
    """The file's tokens (UTF-8, read whole, no <bos>) and its bytes' SHA-256. ValueError naming
    the file where it cannot be read or holds no token."""
    raw = Path(text_file).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{text_file} is not UTF-8 text ({e})") from None
    ids = llm.tokenizer.encode(text, add_bos=False)
    if not ids:
        raise ValueError(f"{text_file} holds no text to score")
    return ids, hashlib.sha256(raw).hexdigest()


def measure(llm: LLM, text_file: Path, settings: Settings, reference: Reference | None = None,
            command: str = "", model: str = "") -> dict:
    """Score `text_file` with `llm` and compare with `reference`; the report (module docstring)."""
    ids, digest = text_ids(llm, text_file)
    windows = text_windows(ids, llm.tokenizer.BOS_ID, settings.context, settings.stride)
    if reference is not None:
        reference.check(ids, settings)
    ref_ids = None if reference is None else reference.top_ids
    started = time.perf_counter()
    scores = score_windows(llm.backend, windows, settings.top_k, ref_ids, settings.max_batch, settings.step_tokens)
    seconds = time.perf_counter() - started
    report = {
        "report_version": REPORT_VERSION,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "text": str(text_file),
        "text_sha256": digest,
        "model": model,
        "backend": llm.backend.identity,
        "weights": llm.weights,
        "kv_dtype": llm.backend.kv_dtype,
        "context": settings.context,
        "stride": settings.stride,
        "windows": len(windows),
        "tokens": len(ids),
        "perplexity": scores.perplexity,
        "seconds": seconds,
        "reference": None if reference is None else _against(scores, reference),
        **_per_token(scores),
    }
    return report


def _against(scores: TokenScores, reference: Reference) -> dict:
    r = reference.report
    c = compare(scores, reference.top_ids, np.asarray(r["top_logprobs"], np.float64),
                np.asarray(r["token_logprobs"], np.float64))
    return {"source": reference.source, "weights": r["weights"], "kv_dtype": r["kv_dtype"],
            "perplexity": c.reference_perplexity, "change": scores.perplexity / c.reference_perplexity - 1,
            "top1_agreement": c.top1_agreement, "mean_kl": c.mean_kl}


def _per_token(scores: TokenScores) -> dict:
    return {"top_k": int(scores.top_ids.shape[1]), "token_ids": scores.token_ids.tolist(),
            "token_logprobs": scores.logprobs.tolist(), "top_ids": scores.top_ids.tolist(),
            "top_logprobs": np.round(scores.top_logprobs, 6).tolist()}


def summary(report: dict) -> str:
    """The figures on a few lines (the per-token arrays left to the JSON)."""
    lines = [f"{report['text']}: {report['tokens']:,} tokens in {report['windows']} window(s) of {report['context']} "
             f"(stride {report['stride']}), {report['seconds']:.1f} s",
             f"model {report['model']}, weights {report['weights']}, KV {report['kv_dtype']}, on {report['backend']}",
             f"perplexity {report['perplexity']:.4f}"]
    ref = report["reference"]
    if ref is not None:
        lines.append(f"against {ref['source']} (weights {ref['weights']}, KV {ref['kv_dtype']}): perplexity "
                     f"{ref['perplexity']:.4f}, change {100 * ref['change']:+.2f}%, top-1 agreement "
                     f"{100 * ref['top1_agreement']:.1f}%, mean KL {ref['mean_kl']:.5f} nats a token")
    return "\n".join(lines)
