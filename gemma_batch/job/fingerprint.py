"""What makes two runs produce the same rows: recorded with a job, compared when it resumes.

It covers the model (config, tokenizer and every checkpoint file's header and size: hashing
tens of GB of weights on every cron run would cost minutes, and a changed tensor changes a
header's offsets or the file size, or was written by hand), the input file's content, the backend,
and every setting that changes a row's output. It leaves out what cannot change a row (batch
size, KV memory, block size, step budget): the engine is batch-invariant.

One entry changes no row: `input_file`, the input's path as seen from the output's folder. An
output belongs to the file it was written from; a job over another file that would replace it
is refused (`store.py`), unless it says the input was renamed (--input-renamed) or --force.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .spec import JobSpec


def model_fingerprint(model_dir: Path, checkpoint_files: Iterable[Path]) -> str:
    """blake2b of config.json, tokenizer.model and each checkpoint file's header and size."""
    h = hashlib.blake2b(digest_size=16)
    for name in ("config.json", "tokenizer.model"):
        path = model_dir / name
        h.update(name.encode() + b"\0" + (path.read_bytes() if path.exists() else b"-"))
    for path in sorted(checkpoint_files):
        with path.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            h.update(path.name.encode() + b"\0" + f.read(min(size, 1 << 26)))
        h.update(str(path.stat().st_size).encode())
    return h.hexdigest()


def job_fingerprint(spec: JobSpec, input_fingerprint: str, model: str, backend: str, max_model_len: int,
                    weights: str) -> dict[str, Any]:
    """The settings a resumed run must share with the run that started the job; `weights` what the
    run's matrices are (`model.quant.weights_label`: `--weights auto` on a bf16 checkpoint is bf16)."""
    fingerprint = {
        "version": 3,  # 2: the request_hash column; 3: cached_prompt_tokens
        "input": input_fingerprint,
        "input_file": spec.input_file,
        "model": model,
        "backend": backend,
        "params": {
            "prompt_column": spec.prompt_column,
            "id_column": spec.id_column,
            "keep_columns": list(spec.keep_columns),
            "chat": spec.chat,
            "output_format": spec.output_format,
            "max_tokens": spec.max_tokens,
            "temperature": spec.temperature,
            "top_k": spec.top_k,
            "top_p": spec.top_p,
            "min_p": spec.min_p,
            "seed": spec.seed,
            "stop": list(spec.stop),
            "max_model_len": max_model_len,
            "weights": weights,
        },
    }
    constraint = spec.constraint
    if constraint is not None:  # (absent, not null, without one: jobs from before constraints still match)
        fingerprint["params"]["constraint"] = {"kind": constraint.kind, "spec": constraint.spec}
    if spec.choices:
        fingerprint["params"]["choices"] = list(spec.choices)
    if spec.logprobs is not None:
        fingerprint["params"]["logprobs"] = spec.logprobs
    if spec.score_only:
        fingerprint["params"]["score_only"] = True
    return fingerprint


def fingerprint_differences(stored: Any, current: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two JSON values ("model", "params.temperature")."""
    if isinstance(stored, dict) and isinstance(current, dict):
        keys: list[str] = []
        for key in sorted(set(stored) | set(current)):
            name = f"{prefix}.{key}" if prefix else key
            if key in stored and key in current:
                keys += fingerprint_differences(stored[key], current[key], name)
            else:
                keys.append(name)
        return keys
    return [] if stored == current else [prefix or "fingerprint"]
