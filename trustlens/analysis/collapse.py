"""Early signs of a collapsing run: detectors over per-step signals, each alert traced back to the
tokens and samples that drove it, ranked.

`step_signals` (trustlens.analysis.signals) builds one row per step: entropy, k3_kl, reward,
accuracy (at evaluations), grad_norm and the block rate of each rule.

`detect_collapse` compares each step with the run's own early baseline: the median m of the first
`baseline_steps` steps (default: alert_window(steps) = min(15, max(5, round(0.1·steps))): 10% of
the steps as in the collapse test, but never more than 15, so that the alerts react within 15
steps however long the run, and a live run's baseline stops moving at step 150), with a robust
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
baseline steps)), the statistic of the reward collapse (`trustlens.analysis.onset`: a fall to
half) over a shorter window, with no z test, as there. accuracy_drop is judged at each
evaluation a after the first, a₀, against a₀ itself (the start the collapse's accuracy test
measures from), with no z test: a warning when one evaluation is below the line, critical when
`accuracy_evals` evaluations in a row are. A step is flagged when its warning or its critical
test holds.

Besides the change, an alert needs a level that matters (`trustlens.analysis.alert_levels`): a
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
most `merge_gap` steps apart (default: alert_window(steps), the baseline's length; a signal that
hovers about its threshold is one episode, not one alert per crossing) merge into one alert that
starts at the first of them (`step`) and ends at `end_step`, carrying the most extreme value (a
critical reward_drop step's value is r̄); an alert is critical from its first critical step on
(`critical_step`), which may come after `step`.

Each alert's driving tokens and samples: `trustlens.analysis.drivers`.

The collapse itself, for measuring how early the alerts came: `trustlens.analysis.onset`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import polars as pl

from trustlens.analysis.alert_config import (
    ALERT_KINDS,
    ALERT_SCHEMA,
    ALERT_WINDOW_MAX,
    REWARD_WINDOW_MAX,
    CollapseConfig,
    alert_window,
)
from trustlens.analysis.alert_levels import learning_steps, mismatch_above_normal, model_kind, trailing_median
from trustlens.analysis.drivers import alert_drivers
from trustlens.analysis.inputs import require_run
from trustlens.analysis.signals import step_signals
from trustlens.core.numbers import decimal, is_rate, percent
from trustlens.core.values import (
    check_choice,
    check_columns,
    check_type,
)
from trustlens.run import blocked_column, rule_of_column


def _baseline(x: np.ndarray, n: int, cfg: CollapseConfig) -> tuple[float, float] | None:
    """(median, robust scale) of the finite values among the first n steps."""
    hist = x[:n]
    hist = hist[np.isfinite(hist)]
    if len(hist) < min(n, 3):
        return None
    m = float(np.median(hist))
    s = 1.4826 * float(np.median(np.abs(hist - m)))
    return m, max(s, cfg.rel_floor * abs(m), 1e-12)


@dataclass
class _Flag:
    """One flagged step of one detector."""

    kind: str
    signal: str
    step: int
    value: float
    baseline: float
    z: float
    critical: bool
    info: bool = False  # an entropy step while the run learns (alert_levels): neither warning nor critical


@dataclass(frozen=True)
class _Detector:
    """A signal judged against its baseline: `up` (rises) or not (falls) by the ratios
    `warn` and `crit` of x̄ to m (`crit` None: never critical; `crit_window`: the critical test
    is on the mean over the baseline window instead), with |x̄ − m| > `min_abs`."""

    kind: str
    signal: str
    up: bool
    warn: float
    crit: float | None
    smooth: bool = True
    min_abs: float = 0.0
    crit_window: bool = False
    lagged: bool = False  # the signal compares π with μ: its baseline starts at baseline_start


def _detectors(signals: pl.DataFrame, cfg: CollapseConfig, rule: str | None) -> list[_Detector]:
    f = cfg.blocked_factor
    out = [
        _Detector("entropy_collapse", "entropy", False, 1 - cfg.entropy_drop, 1 - 2 * cfg.entropy_drop),
        _Detector("entropy_surge", "entropy", True, 1 + cfg.entropy_surge, 1 + 2 * cfg.entropy_surge),
        _Detector("mismatch_growth", "k3_kl", True, cfg.mismatch_growth, None, lagged=True),
        _Detector("grad_norm_spike", "grad_norm", True, cfg.grad_spike, 2 * cfg.grad_spike, smooth=False),
        _Detector("reward_drop", "reward", False, 1 - cfg.reward_drop, 1 - cfg.reward_critical, crit_window=True),
    ]
    watched = [blocked_column(rule)] if rule is not None else [c for c in signals.columns if c.startswith("blocked_")]
    for col in watched:
        if col in signals.columns:
            out += [
                _Detector("blocked_drift", col, True, f, f * f, min_abs=cfg.blocked_drift, lagged=True),
                _Detector("blocked_drift", col, False, 1 / f, 1 / (f * f), min_abs=cfg.blocked_drift, lagged=True),
            ]
    return out


def _passes(d: _Detector, v: float, m: float, ratio: float) -> bool:
    if abs(v - m) <= d.min_abs:
        return False
    return v > ratio * m if d.up else v < ratio * m


def _trailing(x: np.ndarray, i: int, k: int, stat) -> float:
    """`stat` (np.median or np.mean) of the finite values among the k steps ending at step i."""
    recent = x[max(0, i - k + 1) : i + 1]
    recent = recent[np.isfinite(recent)]
    return float(stat(recent)) if len(recent) else math.nan


def _flags(signals: pl.DataFrame, cfg: CollapseConfig, rule: str | None, start: int, kind: str) -> list[_Flag]:
    """Every flagged step of every detector; `kind` is the run's model kind (alert_levels)."""
    steps = signals["step"].to_numpy()
    lag_row = int(np.searchsorted(steps, start))  # the row of the first step ≥ start
    n_base = cfg.baseline_steps if cfg.baseline_steps is not None else alert_window(len(steps))
    n_reward = cfg.reward_window if cfg.reward_window is not None else min(REWARD_WINDOW_MAX, n_base)
    mismatch_level = mismatch_above_normal(signals, kind, cfg.smooth, cfg.mismatch_k3_level)  # (steps,)
    learning = learning_steps(signals, n_base, n_reward)  # (steps,)
    flags: list[_Flag] = []
    for d in _detectors(signals, cfg, rule):
        if d.signal not in signals.columns:
            continue
        x = signals[d.signal].cast(pl.Float64).fill_null(np.nan).to_numpy()
        first = lag_row if d.lagged else 0
        base = _baseline(x[first:], n_base, cfg)
        if base is None:
            continue
        m, s = base
        if not d.up and m <= 0:
            continue  # nothing to fall from
        smoothed = trailing_median(x, cfg.smooth if d.smooth else 1)  # x̄ per step
        for i in range(first + n_base, len(x)):
            if not np.isfinite(x[i]) or (d.kind == "mismatch_growth" and not mismatch_level[i]):
                continue
            v = float(smoothed[i])
            z = (v - m) / s
            warn = abs(z) > cfg.z_warning and _passes(d, v, m, d.warn)
            if d.crit is None:
                crit = False
            elif d.crit_window:
                window = _trailing(x, i, n_reward, np.mean)
                crit = _passes(d, window, m, d.crit)
                if crit:
                    v, z = window, (window - m) / s
            else:
                crit = warn and _passes(d, v, m, d.crit)
            info = d.signal == "entropy" and bool(learning[i])
            if warn or crit:
                flags.append(_Flag(d.kind, d.signal, int(steps[i]), v, m, float(z), crit and not info, info))
    return flags + _accuracy_flags(signals, cfg)


def _accuracy_flags(signals: pl.DataFrame, cfg: CollapseConfig) -> list[_Flag]:
    """accuracy_drop: each evaluation a after the first, a₀, flagged when a < (1 −
    accuracy_drop)·a₀, critical when the last `accuracy_evals` evaluations all are. It has no z
    (NaN): an evaluation's noise depends on its size, which the run's metrics do not hold."""
    if "accuracy" not in signals.columns:
        return []
    evals = signals.select("step", "accuracy").filter(pl.col("accuracy").is_finite())
    if cfg.accuracy_evals < 1:
        raise ValueError(f"accuracy_evals must be ≥ 1, got {cfg.accuracy_evals}")
    if evals.height < 2 or evals["accuracy"][0] <= 0:
        return []
    steps, acc = evals["step"].to_list(), evals["accuracy"].to_numpy()
    a0 = float(acc[0])
    below = acc < (1 - cfg.accuracy_drop) * a0
    return [
        _Flag(
            "accuracy_drop",
            "accuracy",
            int(steps[i]),
            float(acc[i]),
            a0,
            math.nan,
            i >= cfg.accuracy_evals and bool(below[i - cfg.accuracy_evals + 1 : i + 1].all()),
        )
        for i in range(1, len(acc))
        if below[i]
    ]


def _extremity(z: float, value: float, baseline: float) -> float:
    """How far a flagged step is from its baseline: |z|, or |value − baseline| where z is NaN."""
    return abs(z) if math.isfinite(z) else abs(value - baseline)


def _merge(flags: list[_Flag], steps: list[int], gap: int) -> list[dict]:
    """Flagged steps of one detector at most `gap` steps apart (in the run's step order) → one
    episode."""
    index = {s: i for i, s in enumerate(steps)}
    episodes: list[dict] = []
    open_: dict[tuple[str, str], dict] = {}
    for f in sorted(flags, key=lambda f: (f.kind, f.signal, f.step)):
        key = (f.kind, f.signal)
        ep = open_.get(key)
        if ep is not None and index[f.step] <= index[ep["end_step"]] + gap:
            ep["end_step"] = f.step
            ep["info"] = ep["info"] and f.info
            if f.critical and not ep["critical"]:
                ep["critical"], ep["critical_step"] = True, f.step
            if _extremity(f.z, f.value, f.baseline) > _extremity(ep["z"], ep["value"], ep["baseline"]):
                ep["value"], ep["z"] = f.value, f.z
            continue
        ep = {**asdict(f), "end_step": f.step, "critical_step": f.step if f.critical else None}
        open_[key] = ep
        episodes.append(ep)
    return episodes


def _message(ep: dict) -> str:
    what = {
        "entropy_collapse": "mean entropy fell",
        "entropy_surge": "mean entropy rose",
        "mismatch_growth": "training-inference mismatch (k3_kl) grew",
        "grad_norm_spike": "gradient norm spiked",
        "reward_drop": "mean reward dropped",
        "blocked_drift": (
            f"the share of A ≠ 0 tokens the active rule {ep['signal'].removeprefix('blocked_')} blocks moved"
        ),
        "accuracy_drop": "held-out accuracy fell",
    }[ep["kind"]]
    span = f"step {ep['step']}" if ep["step"] == ep["end_step"] else f"steps {ep['step']}–{ep['end_step']}"
    factor = f" ({ep['value'] / ep['baseline']:.2g}× baseline)" if ep["baseline"] else ""
    learning = " while accuracy or reward rose (a policy sharpening as it learns)" if ep["info"] else ""
    shown = percent if is_rate(ep["signal"]) else decimal  # a block rate in percent, as on every page
    return f"{span}: {what} to {shown(ep['value'])} from a baseline of {shown(ep['baseline'])}{factor}{learning}"


def _rollout_lag(run) -> int:
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
    steps = signals["step"].to_list()
    gap = config.merge_gap if config.merge_gap is not None else alert_window(len(steps))
    start = config.baseline_start if config.baseline_start is not None else _rollout_lag(run)
    episodes = _merge(_flags(signals, config, rule, start, model_kind(run)), steps, gap)
    rows = []
    for ep in episodes:
        samples, tokens = alert_drivers(run, ep, config.top_tokens, config.top_samples)
        rows.append(
            {
                "step": ep["step"],
                "end_step": ep["end_step"],
                "kind": ep["kind"],
                "signal": ep["signal"],
                "severity": "critical" if ep["critical"] else "info" if ep["info"] else "warning",
                "critical_step": ep["critical_step"],
                "value": ep["value"],
                "baseline": ep["baseline"],
                "z": ep["z"] if math.isfinite(ep["z"]) else None,
                "message": _message(ep),
                "samples": samples,
                "tokens": tokens,
            }
        )
    if not rows:
        return pl.DataFrame(schema=ALERT_SCHEMA)
    return pl.DataFrame(rows, schema=ALERT_SCHEMA).sort("step", "kind")


__all__ = [
    "ALERT_KINDS",
    "ALERT_SCHEMA",
    "ALERT_WINDOW_MAX",
    "CollapseConfig",
    "alert_window",
    "detect_collapse",
]
