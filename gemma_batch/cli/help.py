"""How the commands' help reads: options in panels, every default shown, the text literal.

Typer renders help with Rich, whose markup would take `[ray]` or `[default: ...]` for tags and
drop them: `Command` escapes every help text of its own, and `option` writes an option's
default into its text. The command and group classes also drop the `<bool>` Typer shows beside
switches (such as --help) and the braces it puts around required arguments in the usage line.
"""

from __future__ import annotations

from typing import Any

import click
import typer
from typer.core import TyperCommand, TyperGroup

INPUT_OUTPUT = "Input and output"
MODEL_DEVICE = "Model and device"
SAMPLING = "Sampling"
CONSTRAINED = "Constrained answers"
BATCHING = "Batching and memory"
JOB_CONTROL = "Job control"
RAY = "Ray"


def escape(text: str) -> str:
    """`text` with every "[" escaped, so that Rich shows it as written (rich.markup.escape, without
    importing Rich at every start)."""
    return text.replace("[", "\\[")


def _bare_help_option(option: click.Option | None) -> click.Option | None:
    if option is not None:
        option.metavar = ""  # (Typer shows the metavar instead of its `<bool>`)
    return option


class Command(TyperCommand):
    """A command whose help is literal text, whose usage line reads `run [OPTIONS] INPUT`, and
    whose --help shows no `<bool>`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = escape(self.help or "")
        for param in self.params:
            if getattr(param, "help", None):
                param.help = escape(param.help)

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return [piece.strip("{}") for piece in super().collect_usage_pieces(ctx)]

    def get_help_option(self, ctx: click.Context) -> click.Option | None:
        return _bare_help_option(super().get_help_option(ctx))


class Group(TyperGroup):
    """The `gemma-batch` group, its --help without `<bool>`."""

    def get_help_option(self, ctx: click.Context) -> click.Option | None:
        return _bare_help_option(super().get_help_option(ctx))


def text(help: str, default: Any = None) -> str:
    """Help text with its default (none: `default` None), as `Command` shows it."""
    return help + ("" if default is None else f" [default: {default}]")


def option(help: str, panel: str, default: Any = None) -> Any:
    """An option whose value is None when not given (so that a TOML job's setting stands),
    `default` being what it then is, said in the help."""
    return typer.Option(None, help=text(help, default), show_default=False, rich_help_panel=panel)


def switch(help: str, panel: str, *names: str, default: Any = None) -> Any:
    """An on/off flag (`--json`, or `--chat/--no-chat` with a None value when not given)."""
    value = None if "/" in names[0] else False
    return typer.Option(value, *names, help=text(help, default), show_default=False, metavar="", rich_help_panel=panel)
