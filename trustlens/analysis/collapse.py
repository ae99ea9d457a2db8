"""Early signs of a collapsing run: detectors over per-step signals, each alert traced back to the
tokens and samples that drove it, ranked.

`step_signals` builds one row per step from the three tables of a run:

    entropy        mean entropy of π over the step's tokens (nats)
    k3_kl, prob_diff_mean training-inference mismatch (trustlens.analysis.mismatch; null without μ)
    reward         mean reward of the step's samples
    grad_norm      the `grad_norm` metric (the mean over ranks of any metric named `grad_norm` or
                   ending in `/grad_norm`)
    blocked_<rule> fraction of the step's A ≠ 0 tokens each rule blocks

`detect_collapse` compares each step with the run's own early baseline: the median m of the
first `baseline_steps` steps (default: collapse_window(steps) = max(5, round(0.1·steps))), with a
robust scale s = 1.4826 · median absolute deviation of those steps, floored at `rel_floor`·|m|.
There is no absolute floor: a small model's signals are judged against its own start. A step
after the baseline is judged on x̄, the median of the signal over the `smooth` steps ending at it
(grad_norm: the step's own value; a median, so one outlier step alone raises no alert), with z = (x̄ − m)/s:

    detector          signal            warning when                  critical when
    entropy_collapse  entropy           x̄ < (1 − entropy_drop)·m      x̄ < (1 − 2·entropy_drop)·m
    entropy_surge     entropy           x̄ > (1 + entropy_surge)·m     x̄ > (1 + 2·entropy_surge)·m
    mismatch_growth   k3_kl             x̄ > mismatch_growth·m         x̄ > 2·mismatch_growth·m
    grad_norm_spike   grad_norm         x > grad_spike·m              x > 2·grad_spike·m
    reward_drop       reward            x̄ < (1 − reward_drop)·m       x̄ < (1 − 2·reward_drop)·m
    blocked_drift     blocked_<active>  x̄ ≥ f·m or x̄ ≤ m/f            the same with f²

and, for every detector, |z| > z_warning (blocked_drift also needs |x̄ − m| > blocked_drift, its
f = blocked_factor). Only the run's active rule (`Run.active_rule`) is watched for blocked_drift:
the other rules' blocked columns are counterfactual (what they would have blocked), context for
reading a run, not alarms; a run that does not name its rule has every rule watched.
Flagged steps of one detector at most `smooth` steps apart merge into one alert that starts at
the first of them (`step`) and ends at `end_step`, carrying the most extreme value; an alert is
critical when any of its steps is.

Driving tokens, at the alert's first step, ranked by a score (highest first): entropy alerts the
tokens of lowest (collapse) or highest (surge) entropy; mismatch_growth |log μ − log π_old|;
grad_norm_spike |A|·π/μ; reward_drop the tokens of negative-advantage samples pushed down the
furthest, |A|·max(μ − π, 0) (over-updates on negative samples, the paper's collapse driver);
blocked_drift the active rule's blocked tokens with the largest binary TV |π − μ|. Samples are
ranked by the mean score of their tokens (reward_drop: lowest reward first).

`collapse_onset` is the collapse itself, for measuring how early the alerts came: the first
evaluation below half the first evaluation's accuracy, or the first step whose trailing mean
reward over `collapse_window(steps)` steps is below half that of the first such window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import polars as pl

from trustlens.analysis.buckets import checked_rules, collect
from trustlens.analysis.mismatch import mismatch_per_step
from trustlens.analysis.summary import exact_aggregates, step_summary
from trustlens.run import blocked_column

ALERT_KINDS = (
    "entropy_collapse",
    "entropy_surge",
    "mismatch_growth",
    "grad_norm_spike",
    "reward_drop",
    "blocked_drift",
)

ALERT_SCHEMA: dict[str, pl.DataType | type[pl.DataType]] = {
    "step": pl.Int32,  # first step of the episode
    "end_step": pl.Int32,  # last consecutive flagged step
    "kind": pl.String,  # one of ALERT_KINDS
    "signal": pl.String,  # the step_signals column it watched (e.g. blocked_ppo)
    "severity": pl.String,  # "warning" or "critical"
    "value": pl.Float64,  # the signal at its most extreme step of the episode
    "baseline": pl.Float64,  # the baseline median m at the first step
    "z": pl.Float64,  # robust z-score at the most extreme step
    "message": pl.String,  # one line for people
    "samples": pl.List(pl.Int64),  # sample ids that drove it, at `step`
    "tokens": pl.List(pl.Struct({"sample": pl.Int64, "update": pl.Int16, "pos": pl.Int32})),
}


@dataclass(frozen=True)
class CollapseConfig:
    """Thresholds of the detectors (see the module docstring)."""

    baseline_steps: int | None = None  # early steps the baseline is taken from; None = collapse_window
    smooth: int = 3  # steps whose median is x̄ (a trailing median) when a step is judged
    z_warning: float = 3.0  # |robust z| a flagged step must exceed
    rel_floor: float = 0.05  # the baseline scale is at least this fraction of |median|
    entropy_drop: float = 0.3  # entropy collapse: fell by this fraction (critical: twice it)
    entropy_surge: float = 0.25  # entropy surge: rose by this fraction (critical: twice it)
    mismatch_growth: float = 2.0  # mismatch growth: k3_kl this multiple of the baseline (critical: twice it)
    grad_spike: float = 4.0  # grad-norm spike: this multiple of the baseline (critical: twice it)
    reward_drop: float = 0.25  # reward drop: fell by this fraction (critical: twice it)
    blocked_drift: float = 0.01  # blocked-rate drift: moved by at least this much (absolute)
    blocked_factor: float = 2.0  # ... and by this factor up or down (critical: its square)
    top_tokens: int = 10  # driving tokens listed per alert
    top_samples: int = 5  # driving samples listed per alert


def collapse_window(steps: int) -> int:
    """Steps of the reward window of the collapse test and of the early baseline: 10% of the
    run's steps, at least 5."""
    return max(5, round(0.1 * steps))


def collapse_onset(
    accuracy: Sequence[tuple[int, float]], reward: Sequence[tuple[int, float]], window: int | None = None
) -> tuple[int | None, str | None]:
    """(step, cause) of the collapse, cause "accuracy" or "reward"; (None, None) without one.

    `accuracy`: (step, held-out accuracy) of each evaluation; `reward`: (step, mean reward) of
    each step. Accuracy collapse: the first evaluation below half the first one's. Reward
    collapse: the first step whose trailing mean over `window` steps (default
    collapse_window(len(reward))) is below half the mean of the first `window` steps. The
    earlier of the two.
    """
    found: list[tuple[int, str]] = []
    acc = sorted(accuracy)
    if acc and acc[0][1] > 0:
        found += [(s, "accuracy") for s, a in acc[1:] if a < 0.5 * acc[0][1]][:1]
    rew = sorted(reward)
    w = collapse_window(len(rew)) if window is None else window
    if w < 1:
        raise ValueError(f"window must be ≥ 1, got {window}")
    values = [r for _, r in rew]
    first = math.fsum(values[:w]) / w if len(values) > w else 0.0
    if first > 0:
        for i in range(w, len(values)):
            if math.fsum(values[i - w + 1 : i + 1]) / w < 0.5 * first:
                found.append((rew[i][0], "reward"))
                break
    return min(found) if found else (None, None)


def _metric_per_step(metrics: pl.LazyFrame, name: str) -> pl.LazyFrame:
    """Mean over ranks of the metric `name` (or any metric ending in `/name`) per step."""
    return (
        metrics.filter((pl.col("name") == name) | pl.col("name").str.ends_with("/" + name))
        .group_by("step")
        .agg(pl.col("value").mean().alias(name))
    )


def step_signals(run) -> pl.DataFrame:
    """One row per step (see the module docstring): step, entropy, k3_kl, prob_diff_mean, reward,
    grad_norm, blocked_<rule>…; null where a run lacks the source. `run` has .tokens, .samples
    and .metrics LazyFrames (a `trustlens.run.Run`); a sampled run's block rates and mismatch
    come from its exact aggregates."""
    tokens = run.tokens
    rules = checked_rules(tokens, None)
    aggregates = exact_aggregates(run)
    per_step = step_summary(tokens, aggregates=aggregates, columns=("entropy", *(blocked_column(r) for r in rules)))
    mm = mismatch_per_step(tokens, aggregates=aggregates).select("step", "k3_kl", "prob_diff_mean")
    reward = collect(run.samples.group_by("step").agg(pl.col("reward").mean().cast(pl.Float64)))
    grad = collect(_metric_per_step(run.metrics, "grad_norm"))
    out = per_step
    for other in (mm, reward, grad):
        out = out.join(other.with_columns(pl.col("step").cast(pl.Int32)), on="step", how="full", coalesce=True)
    cols = ["entropy", "k3_kl", "prob_diff_mean", "reward", "grad_norm", *(blocked_column(r) for r in rules)]
    return (
        out.with_columns(pl.col("step").cast(pl.Int32))
        .select("step", *(pl.col(c).cast(pl.Float64) for c in cols))
        .sort("step")
    )


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


@dataclass(frozen=True)
class _Detector:
    """A signal judged against its baseline: `up` (rises) or not (falls) by the ratios
    `warn` and `crit` of x̄ to m, with |x̄ − m| > `min_abs`."""

    kind: str
    signal: str
    up: bool
    warn: float
    crit: float
    smooth: bool = True
    min_abs: float = 0.0


def _detectors(signals: pl.DataFrame, cfg: CollapseConfig, rule: str | None) -> list[_Detector]:
    f = cfg.blocked_factor
    out = [
        _Detector("entropy_collapse", "entropy", False, 1 - cfg.entropy_drop, 1 - 2 * cfg.entropy_drop),
        _Detector("entropy_surge", "entropy", True, 1 + cfg.entropy_surge, 1 + 2 * cfg.entropy_surge),
        _Detector("mismatch_growth", "k3_kl", True, cfg.mismatch_growth, 2 * cfg.mismatch_growth),
        _Detector("grad_norm_spike", "grad_norm", True, cfg.grad_spike, 2 * cfg.grad_spike, smooth=False),
        _Detector("reward_drop", "reward", False, 1 - cfg.reward_drop, 1 - 2 * cfg.reward_drop),
    ]
    watched = [blocked_column(rule)] if rule is not None else [c for c in signals.columns if c.startswith("blocked_")]
    for col in watched:
        if col in signals.columns:
            out += [
                _Detector("blocked_drift", col, True, f, f * f, min_abs=cfg.blocked_drift),
                _Detector("blocked_drift", col, False, 1 / f, 1 / (f * f), min_abs=cfg.blocked_drift),
            ]
    return out


def _passes(d: _Detector, v: float, m: float, ratio: float) -> bool:
    if abs(v - m) <= d.min_abs:
        return False
    return v > ratio * m if d.up else v < ratio * m


def _flags(signals: pl.DataFrame, cfg: CollapseConfig, rule: str | None) -> list[_Flag]:
    steps = signals["step"].to_numpy()
    n_base = cfg.baseline_steps if cfg.baseline_steps is not None else collapse_window(len(steps))
    flags: list[_Flag] = []
    for d in _detectors(signals, cfg, rule):
        if d.signal not in signals.columns:
            continue
        x = signals[d.signal].cast(pl.Float64).fill_null(np.nan).to_numpy()
        base = _baseline(x, n_base, cfg)
        if base is None:
            continue
        m, s = base
        if not d.up and m <= 0:
            continue  # nothing to fall from
        k = cfg.smooth if d.smooth else 1
        for i in range(n_base, len(x)):
            recent = x[max(0, i - k + 1) : i + 1]
            recent = recent[np.isfinite(recent)]
            if not np.isfinite(x[i]) or len(recent) == 0:
                continue
            v = float(np.median(recent))
            z = (v - m) / s
            if abs(z) > cfg.z_warning and _passes(d, v, m, d.warn):
                flags.append(_Flag(d.kind, d.signal, int(steps[i]), v, m, float(z), _passes(d, v, m, d.crit)))
    return flags


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
            ep["critical"] |= f.critical
            if abs(f.z) > abs(ep["z"]):
                ep["value"], ep["z"] = f.value, f.z
            continue
        ep = {**asdict(f), "end_step": f.step}
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
    }[ep["kind"]]
    span = f"step {ep['step']}" if ep["step"] == ep["end_step"] else f"steps {ep['step']}–{ep['end_step']}"
    factor = f" ({ep['value'] / ep['baseline']:.2g}× baseline)" if ep["baseline"] else ""
    return f"{span}: {what} to {ep['value']:.4g} from a baseline of {ep['baseline']:.4g}{factor}"


def _drivers(run, ep: dict, cfg: CollapseConfig) -> tuple[list[int], list[dict]]:
    """The samples and tokens at the alert's first step that drove it."""
    step = ep["step"]
    tokens = run.tokens.filter(pl.col("step") == step)
    kind, signal = ep["kind"], ep["signal"]
    mu, pi = pl.col("mu_logp").cast(pl.Float64), pl.col("pi_logp").cast(pl.Float64)
    if kind == "reward_drop":
        worst = collect(run.samples.filter(pl.col("step") == step).sort("reward", "sample").head(cfg.top_samples))
        samples = worst["sample"].to_list()
        # over-updates on negative samples: A < 0 tokens whose probability fell furthest below μ
        tokens = tokens.filter(pl.col("advantage") < 0)
        score = pl.col("advantage").abs().cast(pl.Float64) * (mu.exp() - pi.exp()).clip(lower_bound=0.0)
    elif kind in ("entropy_collapse", "entropy_surge"):
        score = pl.col("entropy") * (1 if kind == "entropy_surge" else -1)
        samples = None
    elif kind == "mismatch_growth":
        score = (mu - pl.coalesce(pl.col("old_logp"), pl.col("pi_logp")).cast(pl.Float64)).abs()
        samples = None
    elif kind == "grad_norm_spike":
        # the policy-gradient weight |A| · π/μ of the tokens the update did not block
        score = (pl.col("advantage").abs() * pl.col("ratio")).cast(pl.Float64)
        samples = None
    else:  # blocked_drift: the blocked tokens that moved furthest
        tokens = tokens.filter(pl.col(signal))
        score = pl.col("binary_tv").cast(pl.Float64)
        samples = None
    scored = tokens.select("sample", "update", "pos", score.alias("score")).filter(pl.col("score").is_not_null())
    top = collect(
        scored.sort(["score", "sample", "update", "pos"], descending=[True, False, False, False]).head(cfg.top_tokens)
    )
    if samples is None:
        per_sample = collect(
            scored.group_by("sample")
            .agg(pl.col("score").mean())
            .sort(["score", "sample"], descending=[True, False])
            .head(cfg.top_samples)
        )
        samples = per_sample["sample"].to_list()
    return samples, top.select("sample", "update", "pos").to_dicts()


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
    if signals is None:
        signals = step_signals(run)
    if signals.is_empty():
        return pl.DataFrame(schema=ALERT_SCHEMA)
    if rule is None:
        rule = getattr(run, "active_rule", None)
    episodes = _merge(_flags(signals, config, rule), signals["step"].to_list(), config.smooth)
    rows = []
    for ep in episodes:
        samples, tokens = _drivers(run, ep, config)
        rows.append(
            {
                "step": ep["step"],
                "end_step": ep["end_step"],
                "kind": ep["kind"],
                "signal": ep["signal"],
                "severity": "critical" if ep["critical"] else "warning",
                "value": ep["value"],
                "baseline": ep["baseline"],
                "z": ep["z"],
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
    "CollapseConfig",
    "collapse_onset",
    "collapse_window",
    "detect_collapse",
    "step_signals",
]
