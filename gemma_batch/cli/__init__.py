"""The `gemma-batch` command line: parses options and calls the engine or the job, nothing else.

Exit codes, the same for every command: 0 success; 2 the command cannot start as given (a bad
flag, TOML or value; an input that is missing, unreadable, empty or of no known format, or lacks
a column; a model that is missing or not a Gemma 3 checkpoint; an output folder that is missing
or not writable, or an output that belongs to another job); 1 a failure while running (no device
or memory, a locked output, a write that failed, non-finite logits, a damaged partial folder;
row errors under --fail-on-row-error; `inspect --verify` finding a damaged tensor); 143 / 130
`run` stopped by SIGTERM / SIGINT (finished rows saved, a rerun resumes: job/signals.py).
"""

from __future__ import annotations

import importlib.metadata

import typer

from ..job.spec import DEMO_MODEL
from .cache import cache
from .help import Command, Group
from .inspect import inspect
from .perplexity import perplexity
from .run import run
from .tools import bench, convert, devices, generate
from .tune import tune

app = typer.Typer(cls=Group, add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  rich_markup_mode="rich", help="Batch text generation with Gemma 3 models.")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gemma-batch {importlib.metadata.version('gemma-batch')}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, metavar="",
                                      help="Print the version and exit.")) -> None:
    """Batch text generation with Gemma 3 models."""


for command in (run, generate, inspect, perplexity, convert, bench, tune, devices, cache):
    app.command(cls=Command)(command)

__all__ = ["DEMO_MODEL", "app"]
