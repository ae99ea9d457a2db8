"""`MemoryRun`: a few steps of a run held in memory, read by the analyses as any `Run` is.

The live monitor hands the rows of the step it judges (and the doctor the steps it keeps) to the
same functions that read a finished run (`step_signals`, `alert_drivers`, the doctor's checks),
so that a step is judged live exactly as it is in the finished run.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import polars as pl
import pyarrow as pa

from trustlens.run.reader import Run
from trustlens.run.scan import with_derived
from trustlens.run.schema import RANK, frame_schema

# the tables a step's rows come in (the alerts table is what the monitor writes, not reads)
ROW_TABLES = ("tokens", "samples", "metrics", "aggregates")
Rows: TypeAlias = pl.DataFrame | pl.LazyFrame | pa.Table | pa.RecordBatch


@functools.lru_cache(maxsize=64)
def _empty(table: str, rules: tuple[str, ...]) -> pl.DataFrame:
    """The empty frame of `table` (polars frames are immutable: one is shared by every step)."""
    frame = pl.from_arrow(frame_schema(table, list(rules)).empty_table())
    assert isinstance(frame, pl.DataFrame)
    return frame


def as_frame(table: str, rows: Rows | Iterable[pa.RecordBatch] | None, rules: list[str], rank: int) -> pl.DataFrame:
    """`rows` of `table` as a polars DataFrame shaped as `load_run` reads it: a `rank` column
    (`rank` where the rows lack one), the token text as plain strings."""
    if rows is None:
        return _empty(table, tuple(rules))
    if isinstance(rows, pl.LazyFrame):
        rows = rows.collect()
    elif isinstance(rows, pa.RecordBatch):
        rows = pa.Table.from_batches([rows])
    elif not isinstance(rows, pl.DataFrame | pa.Table):
        batches = list(rows)
        if not batches:
            return _empty(table, tuple(rules))
        rows = pa.Table.from_batches(batches)
    if isinstance(rows, pa.Table):
        arrow = rows.combine_chunks()  # one chunk per column: polars takes it in a third of the time
        if "token" in arrow.column_names and pa.types.is_dictionary(arrow.schema.field("token").type):
            arrow = arrow.set_column(arrow.column_names.index("token"), "token", arrow["token"].cast(pa.string()))
        rows = pl.from_arrow(arrow)
    assert isinstance(rows, pl.DataFrame)
    if RANK not in rows.columns:
        rows = rows.hstack([pl.Series(RANK, [rank], pl.Int16).new_from_index(0, rows.height)])
    return rows


@dataclass(frozen=True)
class MemoryRun(Run):
    """A Run whose tables are in memory (`frames`: table → DataFrame); a table not given is empty."""

    frames: Mapping[str, pl.DataFrame] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, manifest: Mapping[str, Any], frames: Mapping[str, pl.DataFrame], name: str = "live") -> MemoryRun:
        return cls(path=Path(name), manifest=dict(manifest), parts={}, frames=dict(frames))

    def _scan(self, table: str) -> pl.LazyFrame:
        """The table's frame (empty when not given), read as `Run._scan` reads a table's parts."""
        frame = self.frames.get(table)
        if frame is None:
            frame = _empty(table, tuple(self.rules) if table in ("tokens", "aggregates") else ())
        return with_derived(frame.lazy()) if table == "tokens" and self.sampled else frame.lazy()

    @property
    def tokens(self) -> pl.LazyFrame:
        """The token rows (no part files to ask whether any were written: empty when none)."""
        return self._scan("tokens")

    @property
    def sampled(self) -> bool:
        """Recorded with Keep: run.json's `keep`, or aggregate rows among the frames."""
        aggregates = self.frames.get("aggregates")
        return bool(self.manifest.get("keep")) or (aggregates is not None and aggregates.height > 0)


__all__ = ["ROW_TABLES", "MemoryRun", "Rows", "as_frame"]
