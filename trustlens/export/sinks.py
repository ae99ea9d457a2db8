"""Where exported scalars go: a TensorBoard log directory or a W&B run.

A sink takes one step at a time (`log_step(step, scalars)`), the run's collapse alerts
(`log_alerts`: TensorBoard text, a W&B table), each alert raised live (`log_live_alert`,
trustlens.live: TensorBoard text and alert counts, a W&B alert and table) and closes.
`TensorBoardSink` writes event files with tensorboardX (no torch, no TensorFlow needed);
`WandbSink` logs to a W&B run (`WANDB_MODE=offline` works with no network). Each needs its
optional extra; a missing one is named in the error.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from trustlens.core.argument_checks import check_path
from trustlens.core.render import escape_markdown
from trustlens.export.scalars import RUN_TAG, alert_text

EXTRAS = {"tensorboardX": "tensorboard", "wandb": "wandb"}


def require(module: str) -> Any:
    """Import `module` (tensorboardX or wandb), or raise ImportError naming the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        extra = EXTRAS[module]
        raise ImportError(
            f'exporting to {extra} needs the {module!r} package: pip install "trustlens[{extra}]"'
        ) from err


class TensorBoardSink:
    """Scalars and text as TensorBoard event files in the local folder `logdir` (created)."""

    def __init__(self, logdir: str | os.PathLike) -> None:
        tbx = require("tensorboardX")
        self.logdir = os.fspath(check_path("logdir", logdir))
        self._writer = tbx.SummaryWriter(self.logdir)

    def log_step(self, step: int, scalars: Mapping[str, float]) -> None:
        for name, value in scalars.items():
            if not math.isnan(value):
                self._writer.add_scalar(name, value, global_step=step)

    def log_alerts(self, alerts: pl.DataFrame) -> None:
        """Each step's alerts as one Markdown text, `add_text("alerts", ...)`: tensorboardX writes
        it under the tag `alerts/text_summary` (escaped: rule names and messages come from the run)."""
        for step, text in alert_text(alerts).items():
            self._writer.add_text("alerts", text, global_step=step)

    def log_settings(self, settings: Mapping[str, Any]) -> None:
        """run.json's settings the alerts depend on (trustlens.export.scalars.RUN_SETTINGS) as
        JSON text under RUN_TAG at step 0, for `trustlens import` to restore."""
        self._writer.add_text(RUN_TAG, json.dumps(dict(settings), default=str), global_step=0)

    def log_live_alert(self, alert: Any, counts: Mapping[str, int], raised: Sequence[Any]) -> None:
        """A live alert (trustlens.live.LiveAlert) as text under `trustlens/alerts` (escaped)
        and, at the step that raised it, the scalars `trustlens/alerts/<severity>`: how many
        alerts of each severity were raised so far (`counts`)."""
        line = f"**{alert.severity}** {escape_markdown(alert.kind)}: {escape_markdown(alert.message)}"
        self._writer.add_text("trustlens/alerts", line, global_step=alert.raised_at_step)
        for severity, n in counts.items():
            self._writer.add_scalar(f"trustlens/alerts/{severity}", n, global_step=alert.raised_at_step)
        self._writer.flush()

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """Scalars, text and tables logged to a W&B run: `run` if given, else a new one made with
    `wandb.init(**init)` (e.g. project=, name=, dir=, mode="offline") and finished on close."""

    def __init__(self, run: Any | None = None, **init: Any) -> None:
        self._wandb = require("wandb")
        self._owned = run is None
        self.run = self._wandb.init(**init) if run is None else run

    def log_step(self, step: int, scalars: Mapping[str, float]) -> None:
        finite = {k: v for k, v in scalars.items() if not math.isnan(v)}
        self.run.log(finite, step=step)

    def log_alerts(self, alerts: pl.DataFrame) -> None:
        """The alerts as the table `alerts` (step, end_step, severity, kind, signal, message)."""
        self.log_table("alerts", alerts.select("step", "end_step", "severity", "kind", "signal", "message"))

    def log_live_alert(self, alert: Any, counts: Mapping[str, int], raised: Sequence[Any]) -> None:
        """A live alert (trustlens.live.LiveAlert) as `wandb.alert` at its level (critical and
        problem: ERROR, warning: WARN) and the table `trustlens/alerts` of the alerts `raised`
        so far (step, raised_at_step, severity, kind, signal, message)."""
        levels = self._wandb.AlertLevel
        level = levels.ERROR if alert.severity in ("critical", "problem") else levels.WARN
        self.run.alert(title=f"trustlens {alert.severity}: {alert.kind}", text=alert.message, level=level)
        columns = ("step", "raised_at_step", "severity", "kind", "signal", "message")
        rows = [[_cell(getattr(a, c)) for c in columns] for a in raised]
        self.run.log({"trustlens/alerts": self._wandb.Table(columns=list(columns), data=rows)}, commit=False)

    def log_table(self, tag: str, table: pl.DataFrame) -> None:
        """`table` as a W&B Table (cells are stored and shown as text, never as markup)."""
        rows = [[_cell(v) for v in row] for row in table.iter_rows()]
        self.run.log({tag: self._wandb.Table(columns=table.columns, data=rows)}, commit=False)

    def flush(self) -> None:
        """W&B writes as it logs."""

    def close(self) -> None:
        if self._owned:
            self.run.finish()


def _cell(value: Any) -> Any:
    """A table cell W&B can store: text stays text (W&B renders it as text), lists as text."""
    if isinstance(value, (list, tuple, dict)):
        return str(value)
    return value


__all__ = ["TensorBoardSink", "WandbSink", "require"]
