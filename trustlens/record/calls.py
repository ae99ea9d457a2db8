"""The calls of a `TokenRecorder` besides `record` (the rows of `log_metrics` and `log_samples`,
`end_step`, `annotate`, `live_alerts`, `flush`, `close`) and the checks every call starts with (an
open recorder, a step after a resumed run's last one). `RecorderCalls` is TokenRecorder's base
class (trustlens.record.recorder): it holds no state of its own, only the methods on the state
TokenRecorder's constructor sets up (declared below)."""

from __future__ import annotations

import atexit
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trustlens.record.args import int_arg
from trustlens.record.logged_rows import metrics_batch, samples_batch
from trustlens.record.sample_ids import SampleIds
from trustlens.run import interrupts
from trustlens.run.background import BackgroundWriter
from trustlens.run.storage import Remote

if TYPE_CHECKING:
    from trustlens.live.tap import LiveTap


class RecorderCalls:
    """TokenRecorder's calls other than `record`; see trustlens.record.recorder."""

    path: Path | Remote  # the run directory: a local Path, or an object-store location
    _writer: BackgroundWriter  # the run's background writer
    _ids: SampleIds  # the default sample ids handed out so far
    _live: LiveTap | None  # the live alerts of `alerts=`, or None
    _closed: bool  # True once closed or interrupted
    _first_step: int  # the first step this recorder may record (after a resumed run's last one)

    def log_metrics(self, step: int, metrics: Mapping[str, float | int | torch.Tensor]) -> None:
        """Record scalar metrics of `step` (long format: one row per name)."""
        self._check_open()
        step = self._step("step", step)
        batch = metrics_batch(step, metrics)
        self._writer.put_table("metrics", batch)
        self._writer.raise_rejected()

    def log_samples(
        self,
        step: int,
        *,
        prompts: Sequence[str] | None = None,  # (B,) prompt texts
        responses: Sequence[str] | None = None,  # (B,) response texts
        rewards: Sequence[float] | torch.Tensor | None = None,  # (B,) scalar rewards
        advantages: Sequence[float] | torch.Tensor | None = None,  # (B,) sequence advantages
        lengths: Sequence[int] | torch.Tensor | None = None,  # (B,) response lengths in tokens
        sample_ids: Sequence[int] | torch.Tensor | None = None,  # (B,) ids joining tokens.sample
        group_ids: Sequence[int] | torch.Tensor | None = None,  # (B,) prompt-group ids
    ) -> None:
        """Record one row per sample of `step`. Default sample ids follow `record`'s numbering
        (update 0), so that samples logged in the order they were recorded join their tokens.
        A NaN (or None) reward or advantage is stored as null: the sample has none. Sample ids
        must be unique within the call."""
        self._check_open()
        step = self._step("step", step)
        given = {  # argument -> (column, value)
            "prompts": ("prompt", prompts),
            "responses": ("response", responses),
            "rewards": ("reward", rewards),
            "advantages": ("advantage", advantages),
            "lengths": ("length", lengths),
            "sample_ids": ("sample", sample_ids),
            "group_ids": ("group", group_ids),
        }
        key = ("samples", step)
        batch, default_ids = samples_batch(step, given, lambda n: self._ids.first(key, n))
        ids = batch.column("sample").to_numpy()
        self._ids.check_new("sample_ids", key, ids)
        self._writer.put_table("samples", batch)
        self._ids.note(key, int(ids[0]) if default_ids and len(ids) else ids, batch.num_rows)
        self._writer.raise_rejected()

    def end_step(self, step: int) -> None:
        """Every row of `step` was given (tokens, samples, metrics): the live alerts and the
        mirror judge it now rather than when rows of a later step arrive. Does not wait."""
        self._check_open()
        self._writer.end_step(self._step("step", step))

    def annotate(self, fields: Mapping[str, Any]) -> None:
        """Merge `fields` into run.json (rank 0; e.g. why the run stopped), in order with the rows."""
        self._check_open()
        self._writer.put_manifest(dict(fields))

    @property
    def live_alerts(self) -> list:
        """The live alerts (trustlens.live.LiveAlert) raised or changed so far, in order; [] without
        `alerts`. Written by the writer thread: a copy, read at any time."""
        return [] if self._live is None else list(self._live.raised)

    @property
    def live_judged_step(self) -> int | None:
        """The last step the live alerts judged so far (None before the first, or without
        `alerts`); its alerts are in `live_alerts` read after it. Alerts raised later start after
        it, or are among `live_alerts` still provisional."""
        return None if self._live is None else self._live.judged_step

    def flush(self) -> None:
        """Block until every row recorded so far is in complete part files. Raises the
        RejectedInputError of a call whose input the writer thread found bad (trustlens.record)."""
        self._check_open()
        self._writer.flush()

    def close(self, error: BaseException | None = None) -> None:
        """Write what is buffered, stop the writer and end the run: `finished`; `interrupted`
        when `error` is a KeyboardInterrupt; `failed` with any other `error`. Raises the
        writer's error if it failed, else (without `error`) the RejectedInputError of a call
        whose rows were dropped. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        interrupts.unwatch(id(self))
        self._writer.close(error)

    # ---- internals ----

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"the TokenRecorder of {str(self.path)!r} is closed")
        self._writer.raise_error()

    def _interrupted(self, signal_name: str) -> None:
        """SIGTERM / SIGINT: write every row given so far and end the run `interrupted`."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        self._writer.interrupt(signal_name)

    def _step(self, name: str, step: object) -> int:
        """`step` checked: an integer ≥ 0, after the last step of a resumed run."""
        step = int_arg(name, step, 0, 2**31)
        if step < self._first_step:
            raise ValueError(
                f"{name} {step} was recorded before: this run was resumed after step {self._first_step - 1}"
            )
        return step

    def _at_exit(self) -> None:
        """At interpreter exit without close(): keep the rows, and say the run did not close."""
        self.close(RuntimeError("the process exited without TokenRecorder.close()"))


__all__ = ["RecorderCalls"]
