"""`LiveAlert`: one alert or doctor finding as it was raised while the run was written, and the
rows of the run's `alerts` table (docs/run-format.md) it is kept as."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import polars as pl
import pyarrow as pa

from trustlens.run.schema import table_schema

SOURCES = ("collapse", "doctor")
# every severity, least severe first: info (collapse, an entropy change while the run learns),
# warning (both), critical (collapse), problem (doctor); critical and problem rank alike
SEVERITIES = ("info", "warning", "critical", "problem")
_RANK = {"info": 0, "warning": 1, "critical": 2, "problem": 2}


def severity_rank(severity: str) -> int:
    """0 info, 1 warning, 2 critical or problem: what `--stop-on` and `on_alert` levels compare."""
    return _RANK[severity]


@dataclass(frozen=True)
class LiveAlert:
    """An alert raised live (`LiveMonitor.update`), or a change to one. Collapse alerts carry the
    columns of `detect_collapse` (trustlens.analysis.collapse.ALERT_SCHEMA); doctor findings
    carry their check as `kind`, their verdict as `severity` and their summary and fix as
    `message`. The same alert is identified by `key` across its changes."""

    kind: str  # a collapse detector (ALERT_KINDS) or a doctor check (CHECKS)
    step: int  # first step of the alert (a doctor finding: the step at which it was first seen)
    severity: str  # info | warning | critical (collapse); warning | problem (doctor)
    message: str  # one line for people
    source: str  # "collapse" or "doctor"
    raised_at_step: int  # the completed step whose rows raised or changed it
    raised_wall_time: float  # Unix time (s) it was raised or changed
    provisional: bool  # later steps may still change it (an open collapse episode, an accumulating check)
    end_step: int  # last flagged step so far
    critical_step: int | None = None  # first critical step of a collapse alert
    evidence_start_step: int | None = None  # where a collapse alert's evidence began (ALERT_SCHEMA)
    evidence: tuple[str, ...] = ()  # the kinds of the warnings a collapse alert follows
    drivers_step: int | None = None  # the step `samples` and `drivers` are read at (ALERT_SCHEMA)
    signal: str | None = None  # the step signal a collapse alert watches (e.g. blocked_ppo)
    value: float | None = None  # the most extreme value of the signal
    baseline: float | None = None  # its baseline median
    z: float | None = None  # robust z-score at the most extreme step
    samples: tuple[int, ...] = ()  # ids of the samples that drove it, at `step`, strongest first
    drivers: tuple[dict[str, int], ...] = field(default=())  # (sample, update, pos) of the driving tokens at `step`

    @property
    def key(self) -> tuple[str, str, str | None, int]:
        """(source, kind, signal, step): one alert across its rows."""
        return self.source, self.kind, self.signal, self.step

    @property
    def level(self) -> int:
        """severity_rank(severity)."""
        return severity_rank(self.severity)

    def line(self) -> str:
        """One terminal line: severity, kind, message (and 'provisional' while it may change)."""
        mark = " (provisional)" if self.provisional else ""
        return f"{self.severity.upper():<8} {self.kind}{mark}: {self.message}"

    def changed(self, **fields: Any) -> LiveAlert:
        return replace(self, **fields)

    def record(self) -> dict[str, Any]:
        """The alert as a row of `detect_collapse` (ALERT_SCHEMA): the one alert record."""
        return {
            "step": self.step,
            "end_step": self.end_step,
            "kind": self.kind,
            "signal": self.signal,
            "severity": self.severity,
            "critical_step": self.critical_step,
            "evidence_start_step": self.evidence_start_step,
            "evidence": list(self.evidence),
            "value": self.value,
            "baseline": self.baseline,
            "z": self.z,
            "message": self.message,
            "drivers_step": self.drivers_step,
            "samples": list(self.samples),
            "tokens": list(self.drivers),
        }

    @classmethod
    def from_record(
        cls, row: dict[str, Any], *, source: str, raised_at_step: int, raised_wall_time: float, provisional: bool
    ) -> LiveAlert:
        """The LiveAlert of a `detect_collapse` row (ALERT_SCHEMA) raised at `raised_at_step`."""
        return cls(
            kind=row["kind"],
            step=row["step"],
            severity=row["severity"],
            message=row["message"],
            source=source,
            raised_at_step=raised_at_step,
            raised_wall_time=raised_wall_time,
            provisional=provisional,
            end_step=row["end_step"],
            critical_step=row["critical_step"],
            evidence_start_step=row.get("evidence_start_step"),
            evidence=tuple(row.get("evidence") or ()),
            drivers_step=row.get("drivers_step"),
            signal=row["signal"],
            value=row["value"],
            baseline=row["baseline"],
            z=row["z"],
            samples=tuple(row.get("samples") or ()),
            drivers=tuple(row.get("tokens") or ()),
        )


# the prefix of the alert metrics put into a framework's own logged metrics (verl, OpenRLHF)
METRIC_PREFIX = "trustlens/alert/"


def alert_metrics(alerts: Iterable[LiveAlert], prefix: str = METRIC_PREFIX) -> dict[str, float]:
    """The live alerts so far as numbers for a trainer's own metrics: `<prefix>warning`,
    `<prefix>critical` and `<prefix>problem`, how many alerts are at that severity now (0 when
    none), and `<prefix><kind>`, the severity rank (severity_rank) of the most severe alert of
    each kind raised (info alerts are left out)."""
    latest: dict[tuple, LiveAlert] = {}
    for alert in alerts:
        latest[alert.key] = alert
    out = {f"{prefix}{severity}": 0.0 for severity in ("warning", "critical", "problem")}
    for alert in latest.values():
        if alert.level < 1:
            continue
        out[f"{prefix}{alert.severity}"] += 1
        name = f"{prefix}{alert.kind}"
        out[name] = max(out.get(name, 0.0), float(alert.level))
    return out


def alerts_batch(alerts: Iterable[LiveAlert]) -> pa.RecordBatch:
    """The rows of the `alerts` table (trustlens.run.schema.ALERT_COLUMNS) of `alerts`."""
    schema = table_schema("alerts")
    rows = []
    for a in alerts:
        row = asdict(a)
        row["tokens"] = list(row.pop("drivers"))
        row["samples"] = list(row["samples"])
        row["evidence"] = list(row["evidence"])
        row["raised_wall_time"] = datetime.fromtimestamp(a.raised_wall_time, timezone.utc)
        for name in ("value", "baseline", "z"):
            if row[name] is not None and not math.isfinite(row[name]):
                row[name] = None
        rows.append(row)
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def from_rows(frame: pl.DataFrame) -> list[LiveAlert]:
    """LiveAlerts of rows of the `alerts` table (as `Run.alerts` reads them), in row order."""
    return [
        LiveAlert.from_record(
            row,
            source=row["source"],
            raised_at_step=row["raised_at_step"],
            raised_wall_time=row["raised_wall_time"].timestamp(),
            provisional=row["provisional"],
        )
        for row in frame.iter_rows(named=True)
    ]


def live_alerts(run: Any) -> list[LiveAlert]:
    """Each alert a run raised live, as its last row left it (final, or provisional where the
    run stopped before it closed), ordered by step then kind; [] for a run recorded without live
    alerts. `run`: a Run (trustlens.load_run)."""
    frame = run.alerts.collect()
    if frame.is_empty():
        return []
    latest: dict[tuple, LiveAlert] = {}
    for alert in from_rows(frame.sort("raised_at_step", "raised_wall_time", maintain_order=True)):
        latest[alert.key] = alert
    return sorted(latest.values(), key=lambda a: (a.step, a.kind, a.signal or ""))


__all__ = [
    "METRIC_PREFIX",
    "SEVERITIES",
    "SOURCES",
    "LiveAlert",
    "alert_metrics",
    "alerts_batch",
    "from_rows",
    "live_alerts",
    "severity_rank",
]
