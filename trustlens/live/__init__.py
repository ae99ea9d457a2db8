"""Live alerts: the collapse alerts and the doctor's findings of a run while it is written.

`LiveMonitor` is fed one completed step at a time (`update(step, tokens=, samples=, metrics=,
aggregates=)`: that step's rows as they appear in the run's tables) and returns the `LiveAlert`s
new or changed at that step. `replay(run)` feeds it a recorded run step by step.

Collapse alerts (source "collapse"). The monitor runs the detectors of `detect_collapse`
(trustlens.analysis.collapse) on the step's row of `step_signals`, computed from the step's rows
by the same functions, through the same step-by-step detectors
(trustlens.analysis.collapse.steps.CollapseSteps). So an alert raised live is the alert
`detect_collapse` finds on the finished run: same kind, first step, severity and critical step.
The baseline window and merge gap come from the planned steps (run.json `planned_steps`, or the
built-in trainer's `config.steps`; 15 steps when neither is given), which a live run knows. State:
each detector's baseline (until taken), its trailing windows and the open episodes: bounded by
the configuration's windows, never by the run's length.
An alert is raised, `provisional`, at the step whose row opens its episode; it changes (a new row
with the same `key`) when it turns critical or leaves "info" (an entropy episode whose steps no
longer all come while the run learns) and becomes final (provisional False) once `merge_gap`
steps passed without a flagged step of its detector, or when the run ends (`finish`). Its end
step, most extreme value and message are final then; until then they are the ones so far.

Doctor findings (source "doctor"; trustlens.live.doctor): the root-cause checks (temperature,
truncation, shift, sentinel, token_ids) decide from the first steps, the accumulating ones
(level, engine_drift, where) run every few steps on a bounded set of steps, and once more when
the run ends; each finding is raised once, at the first step its verdict is warning or problem
(again if it turns problem).

Where they go. `TokenRecorder(..., alerts=True | CollapseConfig, on_alert=callable)` runs a
monitor in its writer thread (off the training step's path, on host rows: no GPU sync), judges a
step when the recorder is told it ended (`end_step`) or rows of a later step arrive, calls
`on_alert` on a thread of its own (an exception is warned once), sends alerts to the mirror
(TensorBoard, W&B) and keeps them in the run's `alerts` table: one row per alert raised or
changed, with the step (`raised_at_step`) and UTC time (`raised_wall_time`) it was
(docs/run-format.md). `Run.alerts` reads that table; `live_alerts(run)` gives each alert's last
row. A run read later tells the alerts raised live (that table) from the ones `detect_collapse`
finds now.
"""

from trustlens.live.alert import (
    METRIC_PREFIX,
    SEVERITIES,
    SOURCES,
    LiveAlert,
    alert_metrics,
    alerts_batch,
    live_alerts,
    severity_rank,
)
from trustlens.live.doctor import DoctorConfig
from trustlens.live.monitor import LiveMonitor, replay, step_frames
from trustlens.live.rows import MemoryRun

__all__ = [
    "METRIC_PREFIX",
    "SEVERITIES",
    "SOURCES",
    "DoctorConfig",
    "LiveAlert",
    "LiveMonitor",
    "MemoryRun",
    "alert_metrics",
    "alerts_batch",
    "live_alerts",
    "replay",
    "severity_rank",
    "step_frames",
]
