"""Stopping a training run on a live alert: the first alert at the chosen severity, and what
run.json's `stopped` says about it. The built-in trainer (trustlens.train.stopping) and the TRL
hook (trustlens.integrations.trl) stop through here; verl and OpenRLHF through their own
mechanisms (docs/attach.md).

`stop_on` is "critical" (a critical collapse alert or a doctor problem), "warning" (either, or
any warning) or "never".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from trustlens.core.values import check_stop_on
from trustlens.live.alert import LiveAlert, severity_rank


def stop_level(stop_on: str) -> int | None:
    """The least severity rank that stops a run (severity_rank), None for "never"."""
    check_stop_on("stop_on", stop_on)
    return None if stop_on == "never" else severity_rank(stop_on)


def first_at(alerts: Iterable[LiveAlert], level: int | None) -> LiveAlert | None:
    """The first alert (in the order raised) of severity rank `level` or above; None for level None."""
    if level is None:
        return None
    return next((a for a in alerts if a.level >= level), None)


def stopped_entry(stop_on: str, alert: LiveAlert, step: int, checkpoint: str | None) -> dict[str, Any]:
    """run.json's `stopped`: {on, alert: {kind, step, severity, raised_at_step, message}, step (the
    last step trained), checkpoint (the weights kept, or None)}."""
    return {
        "on": stop_on,
        "alert": {
            "kind": alert.kind,
            "step": alert.step,
            "severity": alert.severity,
            "raised_at_step": alert.raised_at_step,
            "message": alert.message,
        },
        "step": step,
        "checkpoint": checkpoint,
    }


__all__ = ["first_at", "stop_level", "stopped_entry"]
