"""The rows a writer writes, gathered per step until the step is complete.

The live consumers of a run being written (the mirror of trustlens.export, the live alerts of
trustlens.live) see every batch of rows the writer thread writes (`add`). A step is complete when
rows of a later step arrive, when the recorder says it is (`TokenRecorder.end_step`), or when the
run closes; `complete` hands over the complete steps, oldest first. What is held is the rows of
the steps not yet complete (one or two steps), never the run.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc


class StepRows:
    """Batches of `tables` rows per step, until `complete` hands the step over."""

    def __init__(self, tables: tuple[str, ...]) -> None:
        self.tables = tables
        self._pending: dict[int, dict[str, list[pa.RecordBatch]]] = {}

    def add(self, table: str, batch: pa.RecordBatch) -> int | None:
        """Hold `batch` (rows of `table`, any steps) by step; the smallest step it holds (rows of
        earlier steps are then complete), None when it holds no row of `tables`."""
        if table not in self.tables or batch.num_rows == 0:
            return None
        steps = batch.column("step")
        present = sorted(set(pc.unique(steps).to_pylist()))
        for step in present:
            part = batch if len(present) == 1 else batch.filter(pc.equal(steps, step))
            self._pending.setdefault(int(step), {t: [] for t in self.tables})[table].append(part)
        return int(present[0])

    def complete(self, before: int | None) -> Iterator[tuple[int, dict[str, list[pa.RecordBatch]]]]:
        """(step, {table: batches}) of every held step < `before` (None: every step), oldest
        first; they are no longer held."""
        for step in sorted(s for s in self._pending if before is None or s < before):
            yield step, self._pending.pop(step)


__all__ = ["StepRows"]
