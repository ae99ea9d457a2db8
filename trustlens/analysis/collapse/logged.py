"""The per-step signals of a run that holds only metrics: one imported from TensorBoard, W&B or
a framework's own log (`trustlens import`, run.json `source`), read from its logged metrics
under trustlens' names (trustlens.metrics, docs/metrics.md) instead of its token rows.

    signal          metric (the first one the run logged)
    entropy         entropy (a trustlens export), entropy/mean (a trainer's)
    k3_kl           k3_kl, else mismatch_kl (K1: both estimate KL(μ ‖ π_old); K1 is noisier and
                    can be negative)
    prob_diff_mean  prob_diff_mean
    reward          reward/mean
    accuracy        eval/accuracy (as every run's: trustlens.analysis.collapse.onset.evaluations)
    grad_norm       grad_norm, or a name ending in /grad_norm (as every run's)
    blocked_<rule>  blocked_frac/<rule> (a trustlens export); the framework's clip fraction
                    (clip_frac) as blocked_ppo: the share of tokens its PPO ratio clip blocks,
                    over all response tokens (A = 0 ones too) where trustlens counts A ≠ 0 ones

A name several ranks logged at a step is their mean. A step is a row when one of these metrics
was logged at it.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from trustlens.analysis.collapse.onset import evaluations

# signal -> the metrics it is read from, first found first
SOURCES = {
    "entropy": ("entropy", "entropy/mean"),
    "k3_kl": ("k3_kl", "mismatch_kl"),
    "prob_diff_mean": ("prob_diff_mean",),
    "reward": ("reward/mean",),
}
# what a page or command that needs per-token data says once about a metrics-only run
NO_TOKENS = "recorded without per-token data: import shows scalars; attach the hook for tokens"
CLIP_RULE = "ppo"  # the rule a framework's clip fraction is the block rate of
_BLOCKED = "blocked_frac/"


def metrics_only(run) -> bool:
    """Whether `run` holds only metrics: run.json names the log it was imported from (`source`)."""
    return isinstance((getattr(run, "manifest", None) or {}).get("source"), dict)


def metric_per_step(metrics: pl.LazyFrame, name: str) -> pl.LazyFrame:
    """Mean over ranks of the metric `name` (or any metric ending in `/name`) per step."""
    return (
        metrics.filter((pl.col("name") == name) | pl.col("name").str.ends_with("/" + name))
        .group_by("step")
        .agg(pl.col("value").mean().alias(name))
    )


def _first_of(metrics: pl.DataFrame, signal: str, names: Sequence[str]) -> pl.DataFrame | None:
    for name in names:
        part = metrics.filter(pl.col("name") == name)
        if part.height:
            return part.group_by("step").agg(pl.col("value").mean().alias(signal))
    return None


def logged_signals(run, rules: str | Sequence[str] | None = None) -> pl.DataFrame:
    """step_signals' columns of a metrics-only run (module docstring): step, entropy, k3_kl,
    prob_diff_mean, reward, accuracy, grad_norm, blocked_<rule>…, one row per step that logged
    one of them. `rules`: the rules whose blocked_<rule> columns are given (None: every one)."""
    metrics = run.metrics.select(pl.col("step").cast(pl.Int32), "name", "value").collect()
    wanted = [rules] if isinstance(rules, str) else None if rules is None else list(rules)
    parts = [p for s, names in SOURCES.items() if (p := _first_of(metrics, s, names)) is not None]
    columns = [*SOURCES, "accuracy", "grad_norm"]
    for other in (evaluations(metrics.lazy()), metric_per_step(metrics.lazy(), "grad_norm")):
        frame = other.collect()
        if frame.height:
            parts.append(frame)
    names = metrics["name"].unique().to_list()
    rates = {n.removeprefix(_BLOCKED): (n,) for n in names if n.startswith(_BLOCKED)}
    if "clip_frac" in names and CLIP_RULE not in rates:
        rates[CLIP_RULE] = ("clip_frac",)
    for rule in sorted(rates):
        if wanted is None or rule in wanted:
            part = _first_of(metrics, f"blocked_{rule}", rates[rule])
            if part is not None:
                parts.append(part)
                columns.append(f"blocked_{rule}")
    steps = pl.concat([p.select(pl.col("step").cast(pl.Int32)) for p in parts]).unique() if parts else None
    if steps is None:
        return pl.DataFrame(schema={"step": pl.Int32, **dict.fromkeys(columns, pl.Float64)})
    out = steps
    for part in parts:
        out = out.join(part.with_columns(pl.col("step").cast(pl.Int32)), on="step", how="left")
    return out.select(
        "step",
        *(pl.col(c).cast(pl.Float64) if c in out.columns else pl.lit(None, pl.Float64).alias(c) for c in columns),
    ).sort("step")


__all__ = ["CLIP_RULE", "NO_TOKENS", "SOURCES", "logged_signals", "metric_per_step", "metrics_only"]
