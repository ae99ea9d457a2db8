"""Early signs of a collapsing run: detectors over per-step signals, each alert traced back to the
tokens and samples that drove it.

`step_signals` builds one row per step from the three tables of a run:

    entropy        mean entropy of π over the step's tokens (nats)
    k3_kl, prob_diff_mean training-inference mismatch (trustlens.analysis.mismatch; null without μ)
    reward         mean reward of the step's samples
    grad_norm      the `grad_norm` metric (the mean over ranks of any metric named `grad_norm` or
                   ending in `/grad_norm`)
    blocked_<rule> fraction of the step's A ≠ 0 tokens each rule blocks

`detect_collapse` compares each step with a robust baseline of the `window` steps before it
(median m, scale s = 1.4826 · median absolute deviation, floored at `rel_floor`·|m| so that a
perfectly flat history does not make every wiggle an alert), z = (x − m)/s:

    entropy_collapse   entropy < m·(1 − entropy_drop)  and z < −z_warning
    entropy_surge      entropy > m·(1 + entropy_surge) and z > z_warning
    mismatch_growth    median of k3_kl over the last `trend` steps > max(mismatch_growth · m,
                       mismatch_floor), and the least-squares slope over those steps is positive
                       (a sustained trend, not one blip)
    grad_norm_spike    grad_norm > grad_spike · m and z > z_warning
    reward_drop        reward < m − reward_drop·|m| and z < −z_warning
    blocked_drift      the blocked fraction moved by a factor ≥ blocked_factor (up or down) and by
                       ≥ blocked_drift (absolute), and |z| > z_warning

Severity is "critical" when |z| ≥ z_critical (for mismatch_growth: the level is twice the
threshold), else "warning". Consecutive flagged steps of one detector merge into one alert that
starts at the first of them (`step`) and ends at `end_step`, carrying the most extreme value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import polars as pl

from trustlens.analysis.buckets import blocked_rate, checked_rules, collect
from trustlens.analysis.mismatch import mismatch_per_step
from trustlens.run import blocked_column

ALERT_KINDS = (
    "entropy_collapse",
    "entropy_surge",
    "mismatch_growth",
    "grad_norm_spike",
    "reward_drop",
    "blocked_drift",
)

ALERT_SCHEMA: dict[str, pl.DataType] = {
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

    window: int = 10  # steps of history the baseline is computed from
    min_history: int = 4  # a step needs this many earlier steps before it can alert
    trend: int = 3  # steps over which mismatch growth is averaged and its slope fitted
    z_warning: float = 4.0  # robust z-score that raises a warning
    z_critical: float = 8.0  # robust z-score that makes it critical
    rel_floor: float = 0.05  # the baseline scale is at least this fraction of |median|
    entropy_drop: float = 0.3  # entropy collapse: fell by at least this fraction
    entropy_surge: float = 0.5  # entropy surge: rose by at least this fraction
    mismatch_growth: float = 3.0  # mismatch growth: level at least this multiple of the baseline
    mismatch_floor: float = 1e-3  # ... and above this k3_kl (nats): growth from ~0 to ~0 is no alert
    grad_spike: float = 4.0  # grad-norm spike: at least this multiple of the baseline
    reward_drop: float = 0.25  # reward drop: fell by at least this fraction of |baseline|
    blocked_drift: float = 0.01  # blocked-fraction drift: moved by at least this much (absolute)
    blocked_factor: float = 2.0  # ... and by at least this factor (binomial noise alone rarely does)
    top_tokens: int = 10  # driving tokens listed per alert
    top_samples: int = 5  # driving samples listed per alert


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
    and .metrics LazyFrames (a `trustlens.run.Run`)."""
    tokens = run.tokens
    rules = checked_rules(tokens, None)
    per_step = collect(
        tokens.group_by("step").agg(
            pl.col("entropy").mean().cast(pl.Float64).alias("entropy"),
            *(blocked_rate(r) for r in rules),
        )
    )
    mm = mismatch_per_step(tokens).select("step", "k3_kl", "prob_diff_mean")
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


def _baseline(x: np.ndarray, i: int, cfg: CollapseConfig) -> tuple[float, float] | None:
    """(median, robust scale) of the finite values in the `window` steps before index i."""
    hist = x[max(0, i - cfg.window) : i]
    hist = hist[np.isfinite(hist)]
    if len(hist) < cfg.min_history:
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


def _flags(signals: pl.DataFrame, cfg: CollapseConfig) -> list[_Flag]:
    steps = signals["step"].to_numpy()
    flags: list[_Flag] = []

    def series(name: str) -> np.ndarray | None:
        if name not in signals.columns:
            return None
        x = signals[name].cast(pl.Float64).fill_null(np.nan).to_numpy()
        return x if np.isfinite(x).any() else None

    def scan(name: str, kinds: list[tuple[str, Callable[[float, float, float], bool]]]) -> None:
        x = series(name)
        if x is None:
            return
        for i in range(len(x)):
            if not np.isfinite(x[i]):
                continue
            base = _baseline(x, i, cfg)
            if base is None:
                continue
            m, s = base
            z = (x[i] - m) / s
            for kind, test in kinds:
                if test(x[i], m, z):
                    flags.append(_Flag(kind, name, int(steps[i]), float(x[i]), m, float(z), abs(z) >= cfg.z_critical))

    scan(
        "entropy",
        [
            ("entropy_collapse", lambda v, m, z: v < m * (1 - cfg.entropy_drop) and z < -cfg.z_warning),
            ("entropy_surge", lambda v, m, z: v > m * (1 + cfg.entropy_surge) and z > cfg.z_warning),
        ],
    )
    scan("grad_norm", [("grad_norm_spike", lambda v, m, z: v > cfg.grad_spike * m and z > cfg.z_warning)])
    scan("reward", [("reward_drop", lambda v, m, z: v < m - cfg.reward_drop * abs(m) and z < -cfg.z_warning)])
    for col in signals.columns:
        if col.startswith("blocked_"):
            scan(
                col,
                [
                    (
                        "blocked_drift",
                        lambda v, m, z: (
                            abs(v - m) > cfg.blocked_drift
                            and abs(z) > cfg.z_warning
                            and (v >= cfg.blocked_factor * m or v * cfg.blocked_factor <= m)
                        ),
                    )
                ],
            )

    x = series("k3_kl")
    if x is not None:
        for i in range(cfg.trend - 1, len(x)):
            recent = x[i - cfg.trend + 1 : i + 1]
            base = _baseline(x, i - cfg.trend + 1, cfg)
            if base is None or not np.isfinite(recent).all():
                continue
            m, s = base
            level = float(np.median(recent))
            slope = np.polyfit(np.arange(cfg.trend), recent, 1)[0] if cfg.trend > 1 else level - m
            if level > max(cfg.mismatch_growth * m, cfg.mismatch_floor) and slope > 0:
                flags.append(
                    _Flag(
                        "mismatch_growth",
                        "k3_kl",
                        int(steps[i]),
                        level,
                        m,
                        (level - m) / s,
                        level > max(2 * cfg.mismatch_growth * m, 2 * cfg.mismatch_floor),
                    )
                )
    return flags


def _merge(flags: list[_Flag], steps: list[int]) -> list[dict]:
    """Consecutive flagged steps (in the run's step order) of one detector → one episode."""
    index = {s: i for i, s in enumerate(steps)}
    episodes: list[dict] = []
    open_: dict[tuple[str, str], dict] = {}
    for f in sorted(flags, key=lambda f: (f.kind, f.signal, f.step)):
        key = (f.kind, f.signal)
        ep = open_.get(key)
        if ep is not None and index[f.step] == index[ep["end_step"]] + 1:
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
        "blocked_drift": f"the fraction of tokens {ep['signal'].removeprefix('blocked_')} blocks moved",
    }[ep["kind"]]
    span = f"step {ep['step']}" if ep["step"] == ep["end_step"] else f"steps {ep['step']}–{ep['end_step']}"
    factor = f" ({ep['value'] / ep['baseline']:.2g}× baseline)" if ep["baseline"] else ""
    return f"{span}: {what} to {ep['value']:.4g} from a baseline of {ep['baseline']:.4g}{factor}"


def _drivers(run, ep: dict, cfg: CollapseConfig) -> tuple[list[int], list[dict]]:
    """The samples and tokens at the alert's first step that drove it."""
    step = ep["step"]
    tokens = run.tokens.filter(pl.col("step") == step)
    kind, signal = ep["kind"], ep["signal"]
    if kind == "reward_drop":
        worst = collect(run.samples.filter(pl.col("step") == step).sort("reward", "sample").head(cfg.top_samples))
        samples = worst["sample"].to_list()
        # the least likely tokens of the worst samples: where those responses went astray
        score = -pl.col("pi_logp").cast(pl.Float64)
        tokens = tokens.filter(pl.col("sample").is_in(samples))
    elif kind in ("entropy_collapse", "entropy_surge"):
        score = pl.col("entropy") * (1 if kind == "entropy_surge" else -1)
        samples = None
    elif kind == "mismatch_growth":
        score = (pl.col("mu_logp") - pl.coalesce(pl.col("old_logp"), pl.col("pi_logp"))).abs()
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
    run, config: CollapseConfig = CollapseConfig(), *, signals: pl.DataFrame | None = None
) -> pl.DataFrame:
    """Alerts of every detector over the run, sorted by step (columns: ALERT_SCHEMA).

    `run` has .tokens, .samples and .metrics LazyFrames; pass `signals` (from `step_signals`) to
    reuse them. Each alert lists the sample ids and the (sample, update, pos) tokens at its first
    step that drove it, for clicking through to the token inspector.
    """
    if signals is None:
        signals = step_signals(run)
    if signals.is_empty():
        return pl.DataFrame(schema=ALERT_SCHEMA)
    episodes = _merge(_flags(signals, config), signals["step"].to_list())
    rows = []
    for ep in episodes:
        samples, tokens = _drivers(run, ep, config)
        z_crit = ep["critical"]
        rows.append(
            {
                "step": ep["step"],
                "end_step": ep["end_step"],
                "kind": ep["kind"],
                "signal": ep["signal"],
                "severity": "critical" if z_crit else "warning",
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


__all__ = ["ALERT_KINDS", "ALERT_SCHEMA", "CollapseConfig", "detect_collapse", "step_signals"]
