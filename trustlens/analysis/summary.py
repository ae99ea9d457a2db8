"""The per-step summary of a run: one row per step with the figures an overview shows first.

Columns:
    step            training step
    tokens          token rows of the step
    samples         distinct samples
    mean_advantage  mean token advantage
    entropy         mean entropy of π, nats
    ratio_mean      mean π/μ
    ratio_max       largest π/μ
    binary_tv_mean  mean |π − μ| (probability)
    binary_tv_max   largest |π − μ|
    zero_adv_frac   share of the step's tokens with A = 0 (no gradient, never blocked)
    blocked_<rule>  fraction of the step's A ≠ 0 tokens (where the rule was evaluated) the rule
                    blocks, per rule
"""

from __future__ import annotations

import polars as pl

from trustlens.analysis.buckets import blocked_rate, checked_rules, collect, zero_advantage_frac


def step_summary_query(tokens: pl.LazyFrame) -> pl.LazyFrame:
    """The lazy query behind `step_summary` (for composing with other queries)."""
    rules = checked_rules(tokens, None)
    return (
        tokens.group_by("step")
        .agg(
            pl.len().cast(pl.Int64).alias("tokens"),
            pl.col("sample").n_unique().cast(pl.Int64).alias("samples"),
            pl.col("advantage").mean().cast(pl.Float64).alias("mean_advantage"),
            pl.col("entropy").mean().cast(pl.Float64).alias("entropy"),
            pl.col("ratio").mean().cast(pl.Float64).alias("ratio_mean"),
            pl.col("ratio").max().cast(pl.Float64).alias("ratio_max"),
            pl.col("binary_tv").mean().cast(pl.Float64).alias("binary_tv_mean"),
            pl.col("binary_tv").max().cast(pl.Float64).alias("binary_tv_max"),
            zero_advantage_frac(),
            *(blocked_rate(r) for r in rules),
        )
        .sort("step")
    )


def step_summary(tokens: pl.LazyFrame) -> pl.DataFrame:
    """One row per step (see the module docstring), sorted by step."""
    return collect(step_summary_query(tokens))


__all__ = ["step_summary", "step_summary_query"]
