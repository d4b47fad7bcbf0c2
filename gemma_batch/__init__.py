"""gemma-batch: offline batch text generation for Gemma 3 models."""

from .engine.llm import LLM

__all__ = ["LLM"]
