"""A TOML job file (`jobs/*.toml`): the same settings as `gemma-batch run`'s flags, named like them
(dashes or underscores), plus `input`. Relative paths in it are relative to the file, so a cron
line works from any directory; a `model` that names no path there (`gemma-3-270m`,
`google/gemma-3-4b-it`) stays a name.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from .spec import PATH_FIELDS, UsageError


def load_toml(path: Path) -> dict[str, Any]:
    """The settings of a TOML job spec, keys normalised to field names, paths made absolute."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise UsageError(f"cannot read job spec {path}: {e.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"job spec {path} is not valid TOML: {e}") from None
    settings = {key.replace("-", "_"): value for key, value in data.items()}
    for key in PATH_FIELDS:  # (jobs/../data/in.jsonl is written data/in.jsonl)
        value = settings.get(key)
        if isinstance(value, str) and (key != "model" or _names_a_path(value, path.parent)):
            settings[key] = Path(os.path.normpath(path.parent / Path(value).expanduser()))
    if "input" not in settings:
        raise UsageError(f"job spec {path} has no 'input' (the prompt dataset)")
    return settings


def _names_a_path(model: str, base: Path) -> bool:
    """Whether a job file's `model` is a path (relative to the file) rather than a name such as
    `gemma-3-270m` or `google/gemma-3-4b-it` (model/sources.py)."""
    return model.startswith((".", "/", "~")) or model.lower().endswith(".gguf") or (base / model).exists()
