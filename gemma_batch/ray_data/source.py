"""The input of `gemma-batch run --ray` as a Ray Data datasource.

The rows are read by gemma-batch's own readers (data/readers.py), in one read task on the
driver's machine, where the input is: so a Ray job sees exactly the rows a local job sees (error
rows for malformed lines, duplicate ids, gzip and zstd, OpenAI Batch files) with their row numbers,
and the input need not be on every machine. Reading is never what bounds a job of model steps.
Each row travels pickled (stage.PACKED) beside its number; rows the job need not run (finished,
or kept from an earlier input) are left out.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from ..data.readers import Dataset
from ..data.rows import InputRow
from .stage import PACKED

BLOCK_ROWS = 256  # rows a block carries to the workers


class JobRows(Datasource):
    """Rows of a job's input whose `todo` entry is set (every row when `todo` is None)."""

    def __init__(self, dataset: Dataset, todo: np.ndarray | None, count: int, block_rows: int = BLOCK_ROWS) -> None:
        """`dataset`: the input as the job opened it (read where it was opened: a file changed
        since fails, `Dataset.rows`); `count`: the rows to run, for Ray's progress."""
        self.dataset, self.todo, self.count, self.block_rows = dataset, todo, count, block_rows

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: object = None) -> list[ReadTask]:
        metadata = BlockMetadata(num_rows=self.count, size_bytes=None, input_files=None, exec_stats=None)
        return [ReadTask(self._read, metadata)]

    def _read(self) -> Iterator[pa.Table]:
        block: list[InputRow] = []
        for row in self.dataset.rows():
            if self.todo is None or self.todo[row.index]:
                block.append(row)
                if len(block) == self.block_rows:
                    yield pack(block)
                    block = []
        if block:
            yield pack(block)


def pack(rows: list[InputRow]) -> pa.Table:
    """A block of rows for GemmaStage: their numbers and the pickled rows."""
    return pa.table({"row": pa.array([r.index for r in rows], pa.int64()),
                     PACKED: pa.array([pickle.dumps(r) for r in rows], pa.binary())})
