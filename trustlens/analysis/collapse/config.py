"""The collapse alerts' configuration (`CollapseConfig`, one comment per threshold), their table
schema, and the window of their early baseline (`alert_window`): what `detect_collapse`
(trustlens.analysis.collapse, whose docstring states each detector) is set with and returns."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from trustlens.analysis.collapse.onset import collapse_window
from trustlens.core.argument_checks import (
    check_fraction,
    check_int,
    check_nonnegative_number,
    check_number,
    check_optional_int,
    check_positive,
)

ALERT_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "step": pl.Int32,  # first step of the episode
    "end_step": pl.Int32,  # last consecutive flagged step
    "kind": pl.String,  # one of ALERT_KINDS (trustlens.analysis.collapse.detectors)
    "signal": pl.String,  # the step_signals column it watched (e.g. blocked_ppo)
    "severity": pl.String,  # "warning", "critical" or "info" (an entropy change while the run learns)
    "critical_step": pl.Int32,  # the episode's first critical step (null for a warning)
    "evidence_start_step": pl.Int32,  # where its evidence began: the first flagged step of it or of the
    # warnings that came before it (a critical alert's earlier signals); the last checkpoint before it is clean
    "evidence": pl.List(pl.String),  # the kinds of those earlier warnings, first first
    "value": pl.Float64,  # x̄ at the episode's most extreme step (a critical reward_drop step: r̄)
    "baseline": pl.Float64,  # the trailing baseline median m at the first step
    "z": pl.Float64,  # robust z-score at the most extreme step (null for accuracy_drop: no scale)
    "message": pl.String,  # one line for people
    "drivers_step": pl.Int32,  # the step its drivers are read at: the one that confirmed it (raised it live)
    "samples": pl.List(pl.Int64),  # sample ids that drove it, at drivers_step
    "tokens": pl.List(pl.Struct({"sample": pl.Int64, "update": pl.Int16, "pos": pl.Int32})),
}


@dataclass(frozen=True)
class CollapseConfig:
    """Thresholds of the detectors (see the module docstring)."""

    baseline_steps: int | None = None  # rows the baseline needs before a step is judged; None = alert_window
    reference_steps: int = 100  # the most rows the trailing baseline holds (the latest unflagged ones)
    baseline_start: int | None = None  # first baseline step of the π-vs-μ signals; None = the run's rollout_lag, or 0
    warmup_steps: int | None = None  # steps of learning-rate warm-up, never in a baseline; None = run.json's
    smooth: int = 3  # steps whose median is x̄ (a trailing median) when a step is judged
    confirm_steps: int = 3  # judged rows in a row a step detector must flag before its episode opens
    merge_gap: int | None = None  # rows without a flagged step that end an episode; None = alert_window
    evidence_steps: int | None = None  # a warning that ended at most this many rows before a critical
    # alert opened is its evidence; None = reference_steps
    z_warning: float = 3.0  # |robust z| a flagged step must exceed
    z_critical: float = 5.0  # |r̄ − m| a critical reward_drop must exceed, in standard errors s/√reward_window
    rel_floor: float = 0.05  # the baseline scale is at least this fraction of |median|
    entropy_drop: float = 0.3  # entropy collapse: fell by this fraction (a warning)
    entropy_surge: float = 0.25  # entropy surge: rose by this fraction (a warning)
    entropy_floor: float = 0.01  # ... and moved by at least this (nats); the least base of the fraction
    mismatch_growth: float = 2.0  # mismatch growth: k3_kl this multiple of the baseline (a warning)
    mismatch_smooth: int = 9  # steps whose median is the mismatch's x̄ (k3 is heavy-tailed: a few tokens)
    mismatch_k3_level: float | None = None  # ... and k3_kl at least this (nats); None = the model kind's normal range
    grad_spike: float = 4.0  # grad-norm spike: this multiple of the baseline (a warning)
    reward_drop: float = 0.25  # reward drop: x̄ fell by this fraction (a warning)
    reward_critical: float = 0.44  # ... critical: r̄, the mean over the last reward_window steps, fell by this fraction
    reward_window: int | None = None  # steps of r̄; None = min(REWARD_WINDOW_MAX, the baseline's steps)
    reward_floor: float = 0.05  # a reward or accuracy fell by at least this (absolute); the least base of the fraction
    blocked_drift: float = 0.01  # blocked-rate drift: moved by at least this much (absolute; the least base)
    blocked_factor: float = 2.0  # ... and by this factor up or down (a warning)
    accuracy_drop: float = 0.25  # accuracy drop without eval_size: an evaluation fell by this fraction of its baseline
    eval_size: int | None = None  # problems per held-out evaluation; None = run.json's `eval_size` (or config's)
    z_accuracy: float = 3.0  # with eval_size: an evaluation fell by more than this many binomial standard errors
    accuracy_min_drop: float = 0.1  # ... and by at least this fraction of its baseline (the policy's own noise)
    cusum_slack: float = 0.5  # the lower CUSUM's allowance k (standard errors per evaluation): where a fall began
    cusum_alarm: float = 5.0  # ... and its alarm h: an evaluation below the line with the CUSUM past h is critical
    accuracy_evals: int = 2  # ... an alert, critical, when this many evaluations in a row did
    accuracy_reference: int = 5  # evaluations whose median is an accuracy level (the latest unflagged ones)
    accuracy_memory: int = 10  # the accuracy baseline is the highest level of this many latest evaluations
    top_tokens: int = 10  # driving tokens listed per alert
    top_samples: int = 5  # driving samples listed per alert

    def __post_init__(self) -> None:
        for name in ("baseline_steps", "merge_gap", "reward_window", "evidence_steps", "eval_size"):
            check_optional_int(name, getattr(self, name), low=1)
        for name in ("baseline_start", "warmup_steps"):
            check_optional_int(name, getattr(self, name), low=0)
        for name in (
            "smooth",
            "mismatch_smooth",
            "confirm_steps",
            "accuracy_evals",
            "accuracy_reference",
            "accuracy_memory",
            "reference_steps",
        ):
            check_int(name, getattr(self, name), low=1)
        for name in ("top_tokens", "top_samples"):
            check_int(name, getattr(self, name), low=0)
        for name in (
            "z_warning",
            "z_critical",
            "z_accuracy",
            "cusum_slack",
            "rel_floor",
            "entropy_floor",
            "reward_floor",
        ):
            check_nonnegative_number(name, getattr(self, name))
        for name in ("entropy_drop", "reward_drop", "reward_critical", "accuracy_drop", "accuracy_min_drop"):
            check_fraction(name, getattr(self, name), zero=False, one=False)
        check_positive("entropy_surge", self.entropy_surge)
        if self.mismatch_k3_level is not None:
            check_positive("mismatch_k3_level", self.mismatch_k3_level)
        check_fraction("blocked_drift", self.blocked_drift)
        for name in ("mismatch_growth", "grad_spike", "blocked_factor"):  # multiples of the baseline
            check_number(name, getattr(self, name), low=1.0, low_open=True)

    @property
    def evidence_rows(self) -> int:
        """Rows within which an ended warning is an outcome alert's evidence: `evidence_steps`,
        else `reference_steps`."""
        return self.evidence_steps if self.evidence_steps is not None else self.reference_steps


# the most steps alert_window gives: the baseline of the alerts
ALERT_WINDOW_MAX = 15
# the most steps r̄, the critical reward mean, averages by default
REWARD_WINDOW_MAX = 10


def alert_window(steps: int) -> int:
    """Steps of the alerts' early baseline: collapse_window, capped at ALERT_WINDOW_MAX (an alert
    must not wait for 10% of a long run to react)."""
    return min(ALERT_WINDOW_MAX, collapse_window(steps))


__all__ = ["ALERT_SCHEMA", "ALERT_WINDOW_MAX", "REWARD_WINDOW_MAX", "CollapseConfig", "alert_window"]
