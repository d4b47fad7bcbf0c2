"""`python -m gemma_batch` is the `gemma-batch` command."""

from .cli import app

app()
