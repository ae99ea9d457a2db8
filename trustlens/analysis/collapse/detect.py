"""Early signs of a collapsing run: detectors over per-step signals, each alert traced back to the
tokens and samples that drove it, ranked.

`step_signals` (trustlens.analysis.collapse.signals) builds one row per step: entropy, k3_kl, reward,
accuracy (at evaluations), grad_norm and the block rate of each rule.

`detect_collapse` compares each step with the run's own early baseline: the median m of the first
`baseline_steps` steps (default: alert_window(planned) = min(15, max(5, round(0.1·planned))),
planned the steps the run plans: run.json's `planned_steps`, or the built-in trainer's
`config.steps`; 15 for a run that names neither (`trustlens.analysis.collapse.detectors.planned_window`).
10% of the steps as in the collapse test, but never more than 15, so that the alerts react within
15 steps however long the run. Planned, not recorded, steps: a run judged live, step by step,
gets the alerts the finished run gets, and a run stopped early keeps the window it had), with a robust
scale s = 1.4826 · median absolute deviation of those steps, floored at `rel_floor`·|m|. The
signals that compare π with μ (k3_kl, blocked_<rule>) take their baseline from step
`baseline_start` on (default: the run's `rollout_lag`, 0 without one): an engine k steps stale
serves the first weights for the first k steps, so the gap between π and μ ramps up over them, and
a baseline taken there would call the steady state growth. There is no absolute floor: a small
model's signals are judged against its own start. A step after the baseline is judged on x̄, the
median of the signal over the `smooth` steps ending at it (grad_norm: the step's own value; a
median, so one outlier step alone raises no alert), with z = (x̄ − m)/s:

    detector          signal            warning when                  critical when
    entropy_collapse  entropy           x̄ < (1 − entropy_drop)·m      x̄ < (1 − 2·entropy_drop)·m
    entropy_surge     entropy           x̄ > (1 + entropy_surge)·m     x̄ > (1 + 2·entropy_surge)·m
    mismatch_growth   k3_kl             x̄ > mismatch_growth·m         never
    grad_norm_spike   grad_norm         x > grad_spike·m              x > 2·grad_spike·m
    reward_drop       reward            x̄ < (1 − reward_drop)·m       r̄ < (1 − reward_critical)·m
    blocked_drift     blocked_<active>  x̄ ≥ f·m or x̄ ≤ m/f            the same with f²
    accuracy_drop     accuracy          a < (1 − accuracy_drop)·a₀    the last accuracy_evals a all are

and, for every x̄ test, |z| > z_warning (blocked_drift also needs |x̄ − m| > blocked_drift, its
f = blocked_factor). r̄ is the mean reward over the last `reward_window` steps (default min(10,
baseline steps)), the statistic of the reward collapse (`trustlens.analysis.collapse.onset`: a fall to
half) over a shorter window, with no z test, as there. accuracy_drop is judged at each
evaluation a after the first, a₀, against a₀ itself (the start the collapse's accuracy test
measures from), with no z test: a warning when one evaluation is below the line, critical when
`accuracy_evals` evaluations in a row are. A step is flagged when its warning or its critical
test holds.

Besides the change, an alert needs a level that matters (`trustlens.analysis.collapse.levels`): a
mismatch_growth step only counts while the mismatch is above the normal range of the run's model
kind (k3_kl ≥ 1e-3 for a dense model, or prob_diff_mean ≥ 0.005; `mismatch_k3_level` overrides
the k3 level), and an entropy alert all of whose steps came while held-out accuracy or reward was
rising is "info", neither warning nor critical.

Only a falling reward or held-out accuracy, or an extreme entropy, gradient or block rate, is
critical; the mismatch never is (it grows in many runs that keep learning). How often the critical
alerts came ahead of a collapse on the claims runs, where the thresholds were set and on seeds
trained after they were frozen, and why the mismatch baseline waits for the engine's lag:
docs/claims.md, "Collapse alerts".

Only the run's active rule (`Run.active_rule`) is watched for blocked_drift: the other rules'
blocked columns are counterfactual (what they would have blocked), context for reading a run, not
alarms; a run that does not name its rule has every rule watched. Flagged steps of one detector at
most `merge_gap` steps apart (default: the baseline's length; a signal that
hovers about its threshold is one episode, not one alert per crossing) merge into one alert that
starts at the first of them (`step`) and ends at `end_step`, carrying the most extreme value (a
critical reward_drop step's value is r̄); an alert is critical from its first critical step on
(`critical_step`), which may come after `step`.

Each alert's driving tokens and samples: `trustlens.analysis.collapse.drivers`.

The collapse itself, for measuring how early the alerts came: `trustlens.analysis.collapse.onset`.
"""

from __future__ import annotations

import math

import polars as pl

from trustlens.analysis.collapse.config import (
    ALERT_KINDS,
    ALERT_SCHEMA,
    ALERT_WINDOW_MAX,
    CollapseConfig,
    alert_window,
)
from trustlens.analysis.collapse.detectors import CollapseSteps, Episode, planned_window
from trustlens.analysis.collapse.drivers import alert_drivers
from trustlens.analysis.collapse.levels import model_kind
from trustlens.analysis.collapse.signals import step_signals
from trustlens.analysis.inputs import require_run
from trustlens.core.numbers import decimal, is_rate, percent
from trustlens.core.values import (
    check_choice,
    check_columns,
    check_type,
)
from trustlens.run import rule_of_column


def alert_message(ep: Episode) -> str:
    """The one line for people of an alert (ALERT_SCHEMA's `message`)."""
    what = {
        "entropy_collapse": "mean entropy fell",
        "entropy_surge": "mean entropy rose",
        "mismatch_growth": "training-inference mismatch (k3_kl) grew",
        "grad_norm_spike": "gradient norm spiked",
        "reward_drop": "mean reward dropped",
        "blocked_drift": (
            f"the share of A ≠ 0 tokens the active rule {ep.signal.removeprefix('blocked_')} blocks moved"
        ),
        "accuracy_drop": "held-out accuracy fell",
    }[ep.kind]
    span = f"step {ep.step}" if ep.step == ep.end_step else f"steps {ep.step}–{ep.end_step}"
    factor = f" ({ep.value / ep.baseline:.2g}× baseline)" if ep.baseline else ""
    learning = " while accuracy or reward rose (a policy sharpening as it learns)" if ep.info else ""
    shown = percent if is_rate(ep.signal) else decimal  # a block rate in percent, as on every page
    return f"{span}: {what} to {shown(ep.value)} from a baseline of {shown(ep.baseline)}{factor}{learning}"


def alert_row(run, ep: Episode, config: CollapseConfig) -> dict:
    """The ALERT_SCHEMA row of an episode, with its drivers read from `run`'s tokens at its step."""
    samples, tokens = alert_drivers(
        run, {"step": ep.step, "kind": ep.kind, "signal": ep.signal}, config.top_tokens, config.top_samples
    )
    return {
        "step": ep.step,
        "end_step": ep.end_step,
        "kind": ep.kind,
        "signal": ep.signal,
        "severity": ep.severity,
        "critical_step": ep.critical_step,
        "value": ep.value,
        "baseline": ep.baseline,
        "z": ep.z if math.isfinite(ep.z) else None,
        "message": alert_message(ep),
        "samples": samples,
        "tokens": tokens,
    }


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
    detectors = CollapseSteps(config, signals.columns, rule, start, model_kind(run), planned_window(run.manifest))
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
    "rollout_lag",
]
