"""Live export while training: `TokenRecorder(..., mirror=...)` streams each step's scalars
(the same ones `trustlens export` writes, trustlens.export.scalars) to TensorBoard or W&B.

The recorder's writer thread hands every batch of token rows, metrics and aggregates it writes
to a `StepMirror`; when rows of a later step arrive (or the recorder closes), the earlier steps
are complete and their scalars go to the sink: `step_scalars` of those steps' rows, as for a
recorded run. A step recorded with `Keep` has aggregates (trustlens.run.aggregates): its block
rates, zero_adv_frac and token-level mismatch are the exact values over all its tokens, not
means over the kept rows, and no sequence-level mismatch is computed from the kept rows. It
runs off the training step's path, and a failing sink never stops the recording: it warns once
and the mirror turns itself off. Each rank mirrors the rows it records (its shard): give
`mirror` on rank 0 only, or a log directory per rank. A `shard=True` mirror (the built-in
trainer's rank 0 under torchrun) sends a logged value, reduced over all ranks by the trainer,
rather than the same name computed from its shard (`step_scalars(..., shard=True)`).
With live alerts on (`TokenRecorder(..., alerts=True)`, trustlens.live), each alert of severity
warning or above, when raised and when it turns more severe, goes to the sink too (`alert`): a
TensorBoard text and the counts `trustlens/alerts/<severity>`, a W&B `wandb.alert` and the table
`trustlens/alerts` (trustlens.export.sinks). A sink without `log_live_alert` gets only scalars.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Protocol

import polars as pl
import pyarrow as pa

from trustlens.core.argument_checks import check_mirror
from trustlens.export.scalars import step_scalars
from trustlens.export.sinks import TensorBoardSink, WandbSink
from trustlens.run.step_rows import StepRows


class Sink(Protocol):
    def log_step(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


TABLES = ("tokens", "metrics", "aggregates")  # the tables whose rows the mirror reads


@dataclass
class _Rows:
    """The rows of some steps, in the shape `step_scalars` reads (like a Run's tables)."""

    tokens: pl.LazyFrame
    metrics: pl.LazyFrame
    aggregates: pl.LazyFrame
    sampled: bool  # the token rows are a sample (recorded with Keep): the aggregates are exact


class StepMirror:
    """Collects the rows the writer writes, per step, and sends each complete step's scalars to
    `sink` (anything with `log_step(step, scalars)` and `close()`)."""

    def __init__(self, sink: Sink, *, shard: bool = False) -> None:
        if not callable(getattr(sink, "log_step", None)) or not callable(getattr(sink, "close", None)):
            raise TypeError(
                f"sink must have log_step(step, scalars) and close() (a mirror string goes to make_mirror), "
                f"got {type(sink).__name__} {sink!r:.80}"
            )
        self.sink = sink
        self.shard = shard  # the rows are one rank's shard of each step: logged values win
        self._rows = StepRows(TABLES)
        self._failed = False
        self._raised: list = []  # the live alerts sent so far (trustlens.live.LiveAlert)
        self._counts: dict[str, int] = {}  # severity -> live alerts of it sent so far

    def add(self, table: str, batch: pa.RecordBatch) -> None:
        """Called by the writer thread with each batch of `tokens`, `metrics` or `aggregates` rows
        it writes."""
        if self._failed:
            return
        first = self._rows.add(table, batch)
        if first is not None:
            self._emit(before=first)

    def end_step(self, step: int) -> None:
        """The recorder says every row of `step` was given: send it now."""
        self._emit(before=step + 1)

    def alert(self, alert) -> None:
        """Send a live alert (trustlens.live.LiveAlert) to a sink that takes them."""
        log = getattr(self.sink, "log_live_alert", None)
        if self._failed or log is None:
            return
        self._raised.append(alert)
        self._counts[alert.severity] = self._counts.get(alert.severity, 0) + 1
        counts = dict(self._counts)
        self._guard(lambda: log(alert, counts, list(self._raised)))

    def close(self) -> None:
        """Send every step still pending and close the sink."""
        self._emit(before=None)
        if not self._failed:
            self._guard(self.sink.close)

    def _emit(self, before: int | None) -> None:
        for step, rows in self._rows.complete(before):
            if self._failed:
                continue
            tables = {t: _frame(rows[t]) for t in TABLES}
            scalars = step_scalars(_Rows(**tables, sampled=bool(rows["aggregates"])), shard=self.shard)
            values = dict(zip(scalars["name"].to_list(), scalars["value"].to_list(), strict=True))
            self._guard(lambda values=values, step=step: self.sink.log_step(step, values))

    def _guard(self, call) -> None:
        try:
            call()
        except Exception as err:  # the recording goes on without the mirror
            self._failed = True
            warnings.warn(f"trustlens mirror to {self.sink!r} failed and is switched off: {err}", stacklevel=2)


def make_mirror(mirror: str | Sink | StepMirror, *, shard: bool = False) -> StepMirror:
    """The StepMirror of a `mirror=` argument: a sink object, or a string
    "tensorboard:LOGDIR", "wandb" or "wandb:PROJECT" (W&B settings from its environment, e.g.
    WANDB_MODE=offline). `shard`: see StepMirror (a StepMirror given is returned as it is)."""
    if isinstance(mirror, StepMirror):
        return mirror
    if isinstance(mirror, str):
        kind, target = check_mirror("mirror", mirror)
        if kind == "tensorboard":
            return StepMirror(TensorBoardSink(target), shard=shard)
        return StepMirror(WandbSink(project=target or None), shard=shard)
    if not callable(getattr(mirror, "log_step", None)) or not callable(getattr(mirror, "close", None)):
        raise ValueError(f"mirror must be a string or have log_step(step, scalars) and close(), got {mirror!r}")
    return StepMirror(mirror, shard=shard)


def _frame(batches: list[pa.RecordBatch]) -> pl.LazyFrame:
    if not batches:
        return pl.LazyFrame(schema={"step": pl.Int32, "name": pl.String, "value": pl.Float64})
    return pl.from_arrow(pa.Table.from_batches(batches)).lazy()  # type: ignore[union-attr]


__all__ = ["Sink", "StepMirror", "make_mirror"]
