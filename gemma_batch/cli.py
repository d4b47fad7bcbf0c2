"""The `gemma-batch` command line: parses options and calls the engine, nothing else."""

from __future__ import annotations

from pathlib import Path

import typer

from .engine.llm import LLM

DEMO_MODEL = Path(__file__).resolve().parent.parent / "sample_data" / "demo-model"

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Batch text generation with Gemma 3 models.")


@app.callback()
def main() -> None:
    """Batch text generation with Gemma 3 models."""


@app.command()
def generate(
    prompts: list[str] = typer.Argument(..., help="Prompts to complete, computed together as one batch."),
    model: Path = typer.Option(DEMO_MODEL, help="A Hugging Face Gemma 3 directory (config.json, safetensors, tokenizer.model)."),
    max_tokens: int = typer.Option(32, min=1, help="Most new tokens per prompt."),
    chat: bool = typer.Option(False, help="Wrap each prompt as a user turn in the Gemma 3 chat template."),
    backend: str = typer.Option("cpu", help="Device backend: cpu."),
) -> None:
    """Complete PROMPTS greedily and print one completion per prompt."""
    try:
        llm = LLM(model, backend=backend)
    except (OSError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    inputs = [[{"role": "user", "content": p}] for p in prompts] if chat else list(prompts)
    for prompt, completion in zip(prompts, llm.generate(inputs, max_tokens=max_tokens)):
        typer.echo(f"{prompt!r} -> {completion!r}")
