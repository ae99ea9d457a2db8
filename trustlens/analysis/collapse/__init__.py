"""Collapse alerts: early signs of a collapsing run, each traced back to the tokens and samples
that drove it (docs/alerts.md).

Modules:
    config     CollapseConfig (one comment per threshold) and ALERT_SCHEMA
    signals    step_signals: the per-step signals the detectors watch
    logged     the same signals of a run that holds only metrics (imported: trustlens import)
    levels     the level an alert needs besides its change (mismatch range, learning)
    detectors  the registry of detectors (DETECTORS: signal, test, message, next step, driver score)
               and the alert kinds it gives (ALERT_KINDS)
    heldout    held-out accuracy's fall (AccuracyFall): binomial noise, the CUSUM's change point
    steps      the detectors fed one step at a time (CollapseSteps): trailing baselines, warm-up,
               episodes and evidence, shared by detect_collapse and the live monitor (trustlens.live)
    detect     detect_collapse over a finished run, and each alert's message
    drivers    the tokens and samples that drove an alert
    onset      the collapse itself (collapse_onset), against which the alerts are measured
    timeline   a run's story in time order (run_timeline)
"""

from trustlens.analysis.collapse.config import (
    ALERT_SCHEMA,
    ALERT_WINDOW_MAX,
    REWARD_WINDOW_MAX,
    CollapseConfig,
    alert_window,
)
from trustlens.analysis.collapse.detect import alert_message, alert_row, detect_collapse, rollout_lag
from trustlens.analysis.collapse.detectors import (
    ALERT_KINDS,
    DETECTORS,
    Detector,
    alert_drivers,
    driver_scores,
    register,
)
from trustlens.analysis.collapse.heldout import AccuracyFall, eval_size
from trustlens.analysis.collapse.levels import model_kind
from trustlens.analysis.collapse.onset import (
    accuracy_per_step,
    collapse_onset,
    collapse_window,
    evaluations,
    reward_per_step,
)
from trustlens.analysis.collapse.signals import step_signals
from trustlens.analysis.collapse.steps import CollapseSteps, Episode, planned_window, warmup_steps
from trustlens.analysis.collapse.timeline import TIMELINE_SCHEMA, episode_span, run_timeline

__all__ = [
    "ALERT_KINDS",
    "ALERT_SCHEMA",
    "ALERT_WINDOW_MAX",
    "DETECTORS",
    "REWARD_WINDOW_MAX",
    "TIMELINE_SCHEMA",
    "AccuracyFall",
    "CollapseConfig",
    "CollapseSteps",
    "Detector",
    "Episode",
    "accuracy_per_step",
    "alert_drivers",
    "alert_message",
    "alert_row",
    "alert_window",
    "collapse_onset",
    "collapse_window",
    "detect_collapse",
    "driver_scores",
    "episode_span",
    "eval_size",
    "evaluations",
    "model_kind",
    "planned_window",
    "register",
    "reward_per_step",
    "rollout_lag",
    "run_timeline",
    "step_signals",
    "warmup_steps",
]
