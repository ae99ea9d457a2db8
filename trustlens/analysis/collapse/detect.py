"""Early signs of a collapsing run: `detect_collapse` runs every registered detector
(trustlens.analysis.collapse.detectors.DETECTORS) over the per-step signals of a finished run
(trustlens.analysis.collapse.signals.step_signals), step by step through the detectors the live
monitor runs (trustlens.analysis.collapse.steps.CollapseSteps: their trailing baseline, warm-up,
episodes and evidence), and traces each alert back to the tokens and samples that drove it.

    detector          signal            flagged when (x̄ against the trailing baseline m)   critical when
    entropy_collapse  entropy           x̄ < (1 − entropy_drop)·m                           never
    entropy_surge     entropy           x̄ > (1 + entropy_surge)·m                          never
    mismatch_growth   k3_kl             x̄ > mismatch_growth·m, above the normal range      never
                                        (x̄: the median of mismatch_smooth steps)
    grad_norm_spike   grad_norm         x > grad_spike·m                                   never
    blocked_drift     blocked_<active>  x̄ ≥ f·m or x̄ ≤ m/f, |x̄ − m| > blocked_drift       never
    reward_drop       reward            x̄ < (1 − reward_drop)·m (m: its highest so far)    r̄ < (1 − reward_critical)·m,
                                                                                           m − r̄ > z_critical·sd/√w
    accuracy_drop     accuracy          never alone                                        accuracy_evals evaluations
                                                                                           in a row below m (median
                                                                                           of the last accuracy_ref.
                                                                                           unflagged) by z_accuracy
                                                                                           binomial standard errors and
                                                                                           accuracy_min_drop·m (without
                                                                                           eval_size: accuracy_drop·m)

and, for every x̄ test, |z| > z_warning with z = (x̄ − m)/s. An entropy alert all of whose steps
came while held-out accuracy or reward rose is "info" (trustlens.analysis.collapse.levels).
Only the outcome (reward, held-out accuracy) is critical; the earlier signals warn and are the
critical alert's evidence. The test of each, its measured false alarms and lead, and why it was
chosen: docs/alerts.md.

Only the run's active rule (`Run.active_rule`) is watched for blocked_drift: the other rules'
blocked columns are counterfactual; a run that does not name its rule has every rule watched.

Each alert's driving tokens and samples: `trustlens.analysis.collapse.drivers`. The collapse
itself, for measuring how early the alerts came: `trustlens.analysis.collapse.onset`.
"""

from __future__ import annotations

import math

import polars as pl

from trustlens.analysis.collapse.config import (
    ALERT_SCHEMA,
    ALERT_WINDOW_MAX,
    CollapseConfig,
    alert_window,
)
from trustlens.analysis.collapse.detectors import ALERT_KINDS, DETECTORS, alert_drivers
from trustlens.analysis.collapse.heldout import eval_size
from trustlens.analysis.collapse.levels import model_kind
from trustlens.analysis.collapse.signals import step_signals
from trustlens.analysis.collapse.steps import CollapseSteps, Episode, planned_window, warmup_steps
from trustlens.analysis.sources import require_run
from trustlens.core.argument_checks import (
    check_choice,
    check_columns,
    check_type,
)
from trustlens.core.numbers import decimal, is_rate, percent
from trustlens.run import rule_of_column


def alert_message(ep: Episode) -> str:
    """The one line for people of an alert (ALERT_SCHEMA's `message`): what moved, from what
    baseline, the earlier warnings it follows, and what to do next."""
    d = DETECTORS[ep.detector]
    what = d.what.format(rule=ep.signal.removeprefix("blocked_"))
    span = f"step {ep.step}" if ep.step == ep.end_step else f"steps {ep.step}–{ep.end_step}"
    floor = d.min_abs(CollapseConfig())
    factor = f" ({ep.value / ep.baseline:.2g}× baseline)" if ep.baseline and abs(ep.baseline) > floor else ""
    learning = " while accuracy or reward rose (a policy sharpening as it learns)" if ep.info else ""
    after = f", after {', '.join(ep.evidence)} from step {ep.evidence_start_step}" if ep.evidence else ""
    shown = percent if is_rate(ep.signal) else decimal  # a block rate in percent, as on every page
    then = d.next.format(step=ep.step, evidence=ep.evidence_start_step)
    return (
        f"{span}: {what} to {shown(ep.value)} from a baseline of {shown(ep.baseline)}{factor}{learning}{after}."
        f" Next: {then}"
    )


def episode_record(ep: Episode) -> dict:
    """The ALERT_SCHEMA columns of an episode but its drivers (`samples`, `tokens`)."""
    return {
        "step": ep.step,
        "end_step": ep.end_step,
        "kind": ep.kind,
        "signal": ep.signal,
        "severity": ep.severity,
        "critical_step": ep.critical_step,
        "evidence_start_step": ep.evidence_start_step,
        "evidence": list(ep.evidence),
        "value": ep.value,
        "baseline": ep.baseline,
        "z": ep.z if math.isfinite(ep.z) else None,
        "message": alert_message(ep),
    }


def alert_row(run, ep: Episode, config: CollapseConfig) -> dict:
    """The ALERT_SCHEMA row of an episode, with its drivers read from `run`'s tokens at the step
    that confirmed it (`opened_step`: the live monitor holds that step's rows when it raises it):
    the one alert record, which `detect_collapse` returns, `trustlens.live.LiveAlert` carries
    (`LiveAlert.record`) and the run's `alerts` table keeps."""
    samples, tokens = alert_drivers(
        run, {"step": ep.opened_step, "kind": ep.kind, "signal": ep.signal}, config.top_tokens, config.top_samples
    )
    return {**episode_record(ep), "drivers_step": ep.opened_step, "samples": samples, "tokens": tokens}


def rollout_lag(run) -> int:
    """The steps a built-in run's rollout engine lags the trainer by (its manifest's config), 0
    when it does not say."""
    config = (getattr(run, "manifest", None) or {}).get("config") or {}
    return int(config.get("rollout_lag") or 0)


def detect_collapse(
    run,
    config: CollapseConfig = CollapseConfig(),
    *,
    signals: pl.DataFrame | None = None,
    rule: str | None = None,
) -> pl.DataFrame:
    """Alerts of every detector over the run, sorted by step (columns: ALERT_SCHEMA).

    `run` has .tokens, .samples and .metrics LazyFrames; pass `signals` (from `step_signals`) to
    reuse them. `rule` is the active rule whose block rate is watched (default: the run's
    `active_rule`; None there too: every rule). Each alert lists the sample ids and the
    (sample, update, pos) tokens at its first step that drove it, strongest driver first, for
    clicking through to the token inspector.
    """
    run = require_run("detect_collapse", run)
    if not isinstance(config, CollapseConfig):
        raise TypeError(f"config must be a CollapseConfig, got {type(config).__name__}")
    if signals is None:
        signals = step_signals(run)
    else:
        check_type("signals", signals, pl.DataFrame, "a polars DataFrame (step_signals(run))")
        check_columns("signals", signals.columns, ["step"])
    if rule is not None:  # a rule the run did not record would silently watch nothing
        recorded = [r for r in (rule_of_column(c) for c in signals.columns) if r is not None]
        check_choice("rule", rule, recorded)
    if signals.is_empty():
        return pl.DataFrame(schema=ALERT_SCHEMA)
    if rule is None:
        rule = getattr(run, "active_rule", None)
    start = config.baseline_start if config.baseline_start is not None else rollout_lag(run)
    manifest = run.manifest
    detectors = CollapseSteps(
        config,
        signals.columns,
        rule,
        start,
        model_kind(run),
        planned_window(manifest),
        warmup=warmup_steps(manifest),
        eval_size=eval_size(manifest),
    )
    for row in signals.iter_rows(named=True):
        detectors.push(row["step"], row)
    rows = [alert_row(run, ep, config) for ep in detectors.episodes]
    if not rows:
        return pl.DataFrame(schema=ALERT_SCHEMA)
    return pl.DataFrame(rows, schema=ALERT_SCHEMA).sort("step", "kind")


__all__ = [
    "ALERT_KINDS",
    "ALERT_SCHEMA",
    "ALERT_WINDOW_MAX",
    "CollapseConfig",
    "alert_message",
    "alert_row",
    "alert_window",
    "detect_collapse",
    "episode_record",
    "rollout_lag",
]
