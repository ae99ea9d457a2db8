"""The live alerts of a `TokenRecorder` (`alerts=`, `on_alert=`): a tap on its writer thread.

`LiveTap` sees every batch of rows the recorder's writer thread writes (`add`), gathers them per
step (trustlens.run.step_rows) and, once a step is complete (rows of a later step arrived, the
recorder's `end_step`, or the run closes), runs the `LiveMonitor` on that step's rows, on the
writer thread: off the training step's path, on rows already copied to the host. What it raises
or changes goes, in order:
- to the run's `alerts` table (the same writer, so the same part files, local or object store),
  written and flushed at once (`RankWriter.append_now`): `trustlens watch` and the dashboard see
  it at their next poll, whatever the writer's `flush_seconds`;
- to `raised` (read by the trainer, e.g. `--stop-on`);
- at severity warning or above, when new or more severe than before: to the mirror (TensorBoard,
  W&B) and to `on_alert`, which runs on a thread of its own (`AlertCalls`), so that a slow
  callable never holds up the writer or training; its first exception is warned, later ones
  are not, and the calls go on.
A failing monitor warns once and switches the alerts off; the recording goes on.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from trustlens.analysis.collapse.config import CollapseConfig
from trustlens.live.alert import LiveAlert, alerts_batch
from trustlens.live.monitor import LiveMonitor
from trustlens.live.rows import ROW_TABLES
from trustlens.run.step_rows import StepRows


def check_on_alert(on_alert: object) -> Callable[[LiveAlert], Any] | None:
    """`on_alert` when it is None or callable; TypeError otherwise."""
    if on_alert is not None and not callable(on_alert):
        raise TypeError(
            f"on_alert must be a callable taking one trustlens.live.LiveAlert (or None), "
            f"got {type(on_alert).__name__} {on_alert!r:.80}"
        )
    return on_alert


class AlertCalls:
    """Calls `on_alert(alert)` for each alert put, in order, on the thread `trustlens-alerts`."""

    def __init__(self, on_alert: Callable[[LiveAlert], Any]) -> None:
        self.on_alert = on_alert
        self.warned = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="trustlens-alerts", daemon=True)
        self._thread.start()

    def put(self, alert: LiveAlert) -> None:
        self._queue.put(alert)

    def close(self, timeout: float) -> None:
        """Make the calls still queued (waiting at most `timeout` seconds) and stop the thread."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            alert = self._queue.get()
            if alert is None:
                return
            try:
                self.on_alert(alert)
            except Exception as err:  # the user's callable: warned once, the calls and the run go on
                if not self.warned:
                    self.warned = True
                    warnings.warn(
                        f"trustlens on_alert {self.on_alert!r:.80} raised {type(err).__name__}: {err} "
                        "(warned once; alerts and recording go on)",
                        RuntimeWarning,
                        stacklevel=1,
                    )


class LiveTap:
    """A writer-thread tap running `monitor` on each completed step (module docstring). `mirror`:
    a StepMirror to send alerts to (trustlens.export.mirror), or None; `timeout`: the most seconds
    `close` waits for `on_alert` calls still queued."""

    def __init__(
        self,
        collapse: CollapseConfig,
        *,
        on_alert: Callable[[LiveAlert], Any] | None = None,
        mirror: Any | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.collapse, self.mirror, self.timeout = collapse, mirror, timeout
        self.monitor: LiveMonitor | None = None  # made by `start`, once the run's manifest is known
        self.calls = None if on_alert is None else AlertCalls(check_on_alert(on_alert))  # type: ignore[arg-type]
        self.write: Callable[[str, pa.RecordBatch], None] | None = None  # the writer's append_now (`start`)
        self.raised: list[LiveAlert] = []  # every alert raised or changed, in order (appended on the writer thread)
        self.latency: list[float] = []  # seconds from a step's end (its last rows, or end_step) to its alerts
        # the last step judged, set once its alerts are in `raised` (read it before `raised`)
        self.judged_step: int | None = None
        self.cpu_s = 0.0  # CPU seconds of the writer thread spent in this tap (gathering rows, judging steps)
        self._rows = StepRows(ROW_TABLES)
        self._sent: dict[tuple, int] = {}  # key -> the severity rank last sent to the mirror and on_alert
        self._ended: dict[int, float] = {}  # step -> monotonic time its last rows came
        self._failed = False

    def start(self, writer: Any, manifest: Mapping[str, Any], rank: int) -> None:
        """Judge the run `writer` (a RankWriter) writes, and write the alerts through its `append`:
        its run.json (rank 0; a resumed run's) or `manifest` (other ranks) says the rules, the
        planned steps and how μ was made."""
        self.monitor = LiveMonitor(writer.manifest or manifest, self.collapse, rank=rank)
        self.write = writer.append_now

    def add(self, table: str, batch: pa.RecordBatch) -> None:
        if self._failed:
            return
        started = time.thread_time()
        first = self._rows.add(table, batch)
        if first is not None:
            self._ended[int(batch.column("step")[-1].as_py())] = time.monotonic()
            self._judge(before=first)
        self.cpu_s += time.thread_time() - started

    def end_step(self, step: int) -> None:
        started = time.thread_time()
        self._ended[step] = time.monotonic()
        self._judge(before=step + 1)
        self.cpu_s += time.thread_time() - started

    def close(self) -> None:
        self._judge(before=None)
        monitor = self.monitor
        if not self._failed and monitor is not None:
            self._guard(lambda: self._emit(monitor.finish(), time.monotonic()))
        if self.calls is not None:
            self.calls.close(self.timeout)

    def _judge(self, before: int | None) -> None:
        for step, tables in self._rows.complete(before):
            if self._failed:
                continue
            ended = self._ended.pop(step, time.monotonic())
            self._guard(functools.partial(self._step, step, tables, ended))

    def _step(self, step: int, tables: dict[str, list[pa.RecordBatch]], ended: float) -> None:
        monitor = self.monitor
        if monitor is None or (monitor.last_step is not None and step <= monitor.last_step):
            return  # rows of a step judged already (logged late): the alerts keep the step as judged
        self._emit(monitor.update(step, **{t: b for t, b in tables.items() if b}), ended)  # type: ignore[arg-type]
        self.judged_step = step

    def _emit(self, alerts: list[LiveAlert], ended: float) -> None:
        if not alerts:
            return
        if self.write is not None:
            self.write("alerts", alerts_batch(alerts))
        self.raised.extend(alerts)
        for alert in alerts:
            if alert.level < 1 or alert.level <= self._sent.get(alert.key, 0):
                continue
            self._sent[alert.key] = alert.level
            if self.mirror is not None:
                self.mirror.alert(alert)
            if self.calls is not None:
                self.calls.put(alert)
            self.latency.append(time.monotonic() - ended)

    def _guard(self, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception as err:  # the recording goes on without live alerts
            self._failed = True
            warnings.warn(
                f"trustlens live alerts failed and are switched off (recording goes on): {type(err).__name__}: {err}",
                RuntimeWarning,
                stacklevel=2,
            )


def live_tap(alerts: object, on_alert: object, mirror: Any | None = None) -> LiveTap:
    """The LiveTap of a recorder's `alerts=` (True or a CollapseConfig; False with an `on_alert`
    means True) and `on_alert=` (a callable or None); TypeError naming a bad one."""
    callback = check_on_alert(on_alert)
    if alerts is True or (alerts is False and callback is not None):
        collapse = CollapseConfig()
    elif isinstance(alerts, CollapseConfig):
        collapse = alerts
    else:
        raise TypeError(f"alerts must be True, False or a CollapseConfig, got {type(alerts).__name__} {alerts!r:.80}")
    return LiveTap(collapse, on_alert=callback, mirror=mirror)


__all__ = ["AlertCalls", "LiveTap", "check_on_alert", "live_tap"]
