"""gemma-batch on Ray Data (`pip install gemma-batch[ray]`): `GemmaStage` for a pipeline's
`map_batches`, and `gemma-batch run --ray` (job.py). docs/RAY.md is the operators' page."""

from .stage import GemmaStage, pool

__all__ = ["GemmaStage", "pool"]
