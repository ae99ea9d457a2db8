"""The collapse detectors' registry: one entry per kind of alert (`DETECTORS`), with the signal it
watches, its test, its message, what the user does next, and its driver score.

A new kind is one `register(Detector(...))` call here: `CollapseSteps` (trustlens.analysis.collapse.steps)
judges every registered detector whose signal a run has, `alert_message` writes its message and
`alert_drivers` ranks its tokens, and the live monitor, the run's `alerts` table and the mirrors
take it from there.

Tests (`Detector.test`):
    "ratio"       a step signal x against its trailing robust baseline m (steps.py): flagged when
                  x̄ (the median of `smooth` steps) is past `factor(cfg)`·m in the detector's
                  direction, |z| > z_warning and |x̄ − m| > `min_abs(cfg)`; never critical
    "outcome"     the same against the highest baseline so far, judged from the first step (a
                  warm-up does not set it), and critical when the mean r̄ over the reward window
                  is past `critical(cfg)`·m and |r̄ − m| > z_critical · sd/√w (its standard error:
                  sd the baseline's spread, steps.py): only an outcome is critical
    "evaluations" held-out accuracy: each evaluation against the median m of the last
                  `accuracy_reference` unflagged ones; below the line when it fell by more than
                  z_accuracy binomial standard errors (√(m(1 − m)/n), n = eval_size) and by
                  accuracy_min_drop·m (by accuracy_drop·m where n is unknown); critical once
                  `accuracy_evals` in a row are below it (one alone raises nothing), from where
                  a lower CUSUM says the fall began (heldout.py `AccuracyFall`)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from trustlens.analysis.collapse.config import CollapseConfig
from trustlens.analysis.collapse.drivers import (
    Score,
    blocked_moved,
    gradient_size,
    high_entropy,
    log_gap,
    low_entropy,
    pushed_below_mu,
    scored_tokens,
    top_drivers,
)
from trustlens.analysis.collapse.logged import metrics_only

Threshold = Callable[[CollapseConfig], float]


@dataclass(frozen=True)
class Detector:
    """One kind of alert (module docstring)."""

    kind: str  # the alert's kind (ALERT_SCHEMA `kind`)
    signal: str  # the step_signals column it watches; "blocked_*": the active rule's block rate
    test: str  # "ratio", "outcome" or "evaluations"
    up: bool  # flagged when the signal rises (else when it falls)
    factor: Threshold  # x̄/m past which a step is flagged (a multiple up, a fraction down)
    what: str  # the message's subject and verb ("mean entropy fell")
    next: str  # what to do next: the page, the tokens, the setting to check
    score: Score  # the driver score of its tokens (trustlens.analysis.collapse.drivers)
    min_abs: Threshold = lambda cfg: 0.0  # |x̄ − m| must exceed this, and m is floored at it in x̄/m
    critical: Threshold | None = None  # "outcome": r̄/m past which the alert is critical
    smooth: Callable[[CollapseConfig], int] = lambda cfg: (
        cfg.smooth
    )  # steps whose median is x̄ (1: the step's own value)
    lagged: bool = False  # compares π with μ: judged from the engine's lag on (baseline_start)


def past(d: Detector, v: float, m: float, ratio: float, floor: float) -> bool:
    """x̄ past ratio·m in the detector's direction, m floored at `floor`, and |x̄ − m| > floor."""
    if abs(v - m) <= floor:
        return False
    base = max(abs(m), floor)
    return v > ratio * base if d.up else v < ratio * base


DETECTORS: dict[str, Detector] = {}


def register(detector: Detector) -> Detector:
    """Add a detector to DETECTORS (its kind must be new)."""
    if detector.kind in DETECTORS:
        raise ValueError(f"detector {detector.kind!r} is registered already")
    if detector.test not in ("ratio", "outcome", "evaluations"):
        raise ValueError(f"detector test must be ratio, outcome or evaluations, got {detector.test!r}")
    DETECTORS[detector.kind] = detector
    return detector


_TOKENS = "the Token inspector at step {step}"
register(
    Detector(
        "entropy_collapse",
        "entropy",
        "ratio",
        False,
        lambda c: 1 - c.entropy_drop,
        "mean entropy fell",
        f"open {_TOKENS}, lowest-entropy tokens first; check the sampling temperature and the entropy bonus",
        low_entropy,
        min_abs=lambda c: c.entropy_floor,
    )
)
register(
    Detector(
        "entropy_surge",
        "entropy",
        "ratio",
        True,
        lambda c: 1 + c.entropy_surge,
        "mean entropy rose",
        f"open {_TOKENS}, highest-entropy tokens first; check the learning rate and the sampling temperature",
        high_entropy,
        min_abs=lambda c: c.entropy_floor,
    )
)
register(
    Detector(
        "mismatch_growth",
        "k3_kl",
        "ratio",
        True,
        lambda c: c.mismatch_growth,
        "training-inference mismatch (k3_kl) grew",
        "open the Mismatch page and run `trustlens doctor`; check the engine's precision (fp8/bf16), its weight "
        "sync and its lag (rollout_lag)",
        log_gap,
        smooth=lambda c: max(c.smooth, c.mismatch_smooth),
        lagged=True,
    )
)
register(
    Detector(
        "grad_norm_spike",
        "grad_norm",
        "ratio",
        True,
        lambda c: c.grad_spike,
        "gradient norm spiked",
        f"open {_TOKENS}, the largest |A|·π/μ·(1 − π) first; check the gradient clip and the learning rate",
        gradient_size,
        smooth=lambda c: 1,
    )
)
register(
    Detector(
        "blocked_drift_up",
        "blocked_*",
        "ratio",
        True,
        lambda c: c.blocked_factor,
        "the share of A ≠ 0 tokens the active rule {rule} blocks rose",
        "open the PPO vs DPPO page at step {step} for the tokens it blocks; check the engine's mismatch "
        "(Mismatch page) before the rule's thresholds",
        blocked_moved,
        min_abs=lambda c: c.blocked_drift,
        lagged=True,
    )
)
register(
    Detector(
        "blocked_drift_down",
        "blocked_*",
        "ratio",
        False,
        lambda c: 1 / c.blocked_factor,
        "the share of A ≠ 0 tokens the active rule {rule} blocks fell",
        "open the PPO vs DPPO page at step {step}; check the rule's thresholds and the learning rate",
        blocked_moved,
        min_abs=lambda c: c.blocked_drift,
        lagged=True,
    )
)
_OUTCOME_NEXT = (
    "open the Collapse signals page: its driving tokens (A < 0, pushed furthest below μ) are where the "
    "update over-shot; check the trust region (the active rule, its thresholds) and keep the last checkpoint "
    "before step {evidence}"
)
register(
    Detector(
        "reward_drop",
        "reward",
        "outcome",
        False,
        lambda c: 1 - c.reward_drop,
        "mean reward dropped",
        _OUTCOME_NEXT,
        pushed_below_mu,
        min_abs=lambda c: c.reward_floor,
        critical=lambda c: 1 - c.reward_critical,
    )
)
register(
    Detector(
        "accuracy_drop",
        "accuracy",
        "evaluations",
        False,
        lambda c: 1 - c.accuracy_drop,
        "held-out accuracy fell",
        _OUTCOME_NEXT,
        pushed_below_mu,
        min_abs=lambda c: c.reward_floor,
    )
)

# the detectors of one alert kind as the alerts table names it: blocked_drift has two directions
ALERT_KIND = {"blocked_drift_up": "blocked_drift", "blocked_drift_down": "blocked_drift"}


def alert_kind(detector: str) -> str:
    """The ALERT_KINDS name of a registered detector."""
    return ALERT_KIND.get(detector, detector)


# the alerts table's kinds, in the order registered: one per detector, blocked_drift's two as one
ALERT_KINDS: tuple[str, ...] = tuple(dict.fromkeys(alert_kind(k) for k in DETECTORS))


def detector_of(kind: str, signal: str, up: bool | None = None) -> Detector:
    """The registered detector of an alert `kind` (an ALERT_KINDS name) on `signal`; blocked_drift
    by its direction `up` (None: up)."""
    if kind == "blocked_drift":
        return DETECTORS["blocked_drift_down" if up is False else "blocked_drift_up"]
    if kind not in DETECTORS:
        raise ValueError(f"unknown alert kind {kind!r}; kinds: {', '.join(sorted({alert_kind(k) for k in DETECTORS}))}")
    return DETECTORS[kind]


def driver_scores(run, step: int, kind: str, signal: str) -> pl.LazyFrame:
    """The tokens of `step` an alert of `kind` on `signal` ranks, with their score
    (trustlens.analysis.collapse.drivers): columns sample, update, pos, score."""
    return scored_tokens(run, step, signal, detector_of(kind, signal).score)


def alert_drivers(run, ep: dict, top_tokens: int, top_samples: int) -> tuple[list[int], list[dict]]:
    """The ids of the `top_samples` samples and the (sample, update, pos) of the `top_tokens`
    tokens at the alert's first step that drove it, strongest first. `ep` has the alert's step,
    kind and signal (ALERT_SCHEMA); none for a run that holds only metrics (imported)."""
    if metrics_only(run):
        return [], []
    return top_drivers(driver_scores(run, ep["step"], ep["kind"], ep["signal"]), top_tokens, top_samples)


__all__ = [
    "ALERT_KIND",
    "ALERT_KINDS",
    "DETECTORS",
    "Detector",
    "alert_drivers",
    "alert_kind",
    "detector_of",
    "driver_scores",
    "past",
    "register",
]
