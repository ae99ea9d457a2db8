"""Stopping a training run on a live alert: the first alert at the chosen severity, the weights a
stop keeps, and what run.json's `stopped` says about it. The built-in trainer
(trustlens.train.stopping) and the TRL hook (trustlens.integrations.trl) stop through here; verl
and OpenRLHF through their own mechanisms (docs/attach.md).

`stop_on` is "critical" (a critical collapse alert or a doctor problem), "warning" (either, or
any warning) or "never".

The weights kept: an alert's evidence begins at its first flagged step or evaluation
(`evidence_start`). The checkpoint kept is the last one taken before that step whose held-out
evaluation came before it too (a checkpoint at step s holds the weights before step s's update,
the weights the evaluation at step s measures), so that the weights whose evaluation raised the
alert are never the ones kept; without an evaluated one (a run without evaluations), the last
checkpoint before the evidence; None when there is none (the run's warm start is then the last
weights from before it). A run that closes after such a stop ends with status `stopped`
(trustlens.run.writer), and `trustlens train` exits with EXIT_ALERT_STOP.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from trustlens.core.argument_checks import EXIT_ALERT_STOP, check_stop_on
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


def evidence_start(alert: LiveAlert) -> int:
    """The step the alert's evidence begins at: its first flagged step or evaluation, or that of
    the earlier warnings it counts as evidence (`LiveAlert.evidence_start_step`); the alert's own
    step where the detector recorded none (the doctor's findings)."""
    return alert.step if alert.evidence_start_step is None else min(alert.step, alert.evidence_start_step)


def kept_checkpoint(taken: Iterable[int], evaluated: Collection[int], start: int) -> int | None:
    """The step of the checkpoint a stop keeps for evidence beginning at step `start` (module
    docstring): the last of `taken` (checkpoint steps) before `start` that is in `evaluated`
    (steps with a held-out evaluation), else the last of `taken` before `start`, else None."""
    before = sorted(s for s in taken if s < start)
    judged = [s for s in before if s in evaluated]
    return judged[-1] if judged else before[-1] if before else None


def stopped_entry(
    stop_on: str,
    alert: LiveAlert,
    step: int,
    checkpoint: str | None,
    *,
    checkpoint_step: int | None = None,
    checkpoint_accuracy: float | None = None,
) -> dict[str, Any]:
    """run.json's `stopped`: {on, alert: {kind, step, severity, raised_at_step, message}, step (the
    last step trained), evidence_start_step, checkpoint (the weights kept, or None), checkpoint_step
    and checkpoint_accuracy (its held-out accuracy; None when not evaluated or not known)}."""
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
        "evidence_start_step": evidence_start(alert),
        "checkpoint": checkpoint,
        "checkpoint_step": checkpoint_step,
        "checkpoint_accuracy": checkpoint_accuracy,
    }


__all__ = ["EXIT_ALERT_STOP", "evidence_start", "first_at", "kept_checkpoint", "stop_level", "stopped_entry"]
