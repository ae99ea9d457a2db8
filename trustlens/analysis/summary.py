"""The per-step summary of a run: one row per step with the figures an overview shows first.

Columns:
    step            training step
    tokens          tokens of the step (a sampled run: the exact count from its aggregates, else
                    Σ weight of the kept rows, an estimate)
    samples         distinct samples among the rows (not with `aggregates`: a sampled run's rows
                    hold only some of its samples, and the aggregates do not count them)
    mean_advantage  mean token advantage
    entropy         mean entropy of π, nats
    ratio_mean      mean π/μ
    ratio_max       largest π/μ
    binary_tv_mean  mean |π − μ| (probability)
    binary_tv_max   largest |π − μ|
    zero_adv_frac   share of the step's tokens with A = 0 (no gradient, never blocked)
    blocked_<rule>  fraction of the step's A ≠ 0 tokens (where the rule was evaluated) the rule
                    blocks, per rule

A sampled run (recorded with `Keep`): means count each kept row with its sampling weight
(estimates of the means over all tokens); maxima are over the kept rows (which hold every token
of top divergence); with `aggregates`, tokens, zero_adv_frac and blocked_<rule> are exact, and
so is entropy when the aggregates hold its sum (runs recorded since 2026-11-26).
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from trustlens.analysis.buckets import (
    blocked_rate,
    checked_rules,
    collect,
    weighted,
    weighted_count,
    weighted_mean,
    zero_advantage_frac,
)
from trustlens.analysis.sources import RunOrTokens, require_run, token_rows
from trustlens.core.argument_checks import check_names, check_step_range
from trustlens.run import blocked_column
from trustlens.run.aggregates import step_aggregates

# step_summary's columns before the blocked_<rule> ones, in order
SUMMARY_COLUMNS = (
    "tokens",
    "samples",
    "mean_advantage",
    "entropy",
    "ratio_mean",
    "ratio_max",
    "binary_tv_mean",
    "binary_tv_max",
    "zero_adv_frac",
)


def exact_aggregates(run, steps: tuple[int, int] | None = None) -> pl.LazyFrame | None:
    """The exact aggregates of all tokens of a sampled `run` (`Run.aggregates`), limited to steps
    in [lo, hi] when `steps` is given, for the `aggregates` argument of the analyses; None for a
    run that recorded every token (its rows are exact already)."""
    run = require_run("exact_aggregates", run)
    bounds = None if steps is None else check_step_range("steps", steps)
    if not run.sampled:
        return None
    if bounds is None:
        return run.aggregates
    return run.aggregates.filter(pl.col("step").is_between(*bounds))


def step_summary_query(
    tokens: pl.LazyFrame, *, counts: bool = True, rules: Sequence[str] | None = None
) -> pl.LazyFrame:
    """The lazy query behind `step_summary` on the token rows alone (for composing with other
    queries). counts=False leaves out what exact aggregates give (tokens, zero_adv_frac,
    blocked_<rule>), sparing a sampled run's scan those columns; `rules`: the rules whose
    blocked_<rule> it computes (None: every rule the rows hold)."""
    rules = checked_rules(tokens, rules)
    w = weighted(tokens)
    counted = [
        (weighted_count().round() if w else pl.len()).cast(pl.Int64).alias("tokens"),
        zero_advantage_frac(weights=w),
        *(blocked_rate(r, weights=w) for r in rules),
    ]
    return (
        tokens.group_by("step")
        .agg(
            *(counted[:1] if counts else ()),
            pl.col("sample").n_unique().cast(pl.Int64).alias("samples"),
            weighted_mean(pl.col("advantage"), weights=w).alias("mean_advantage"),
            weighted_mean(pl.col("entropy"), weights=w).alias("entropy"),
            weighted_mean(pl.col("ratio"), weights=w).alias("ratio_mean"),
            pl.col("ratio").max().cast(pl.Float64).alias("ratio_max"),
            weighted_mean(pl.col("binary_tv"), weights=w).alias("binary_tv_mean"),
            pl.col("binary_tv").max().cast(pl.Float64).alias("binary_tv_max"),
            *(counted[1:] if counts else ()),
        )
        .sort("step")
    )


def step_summary(
    tokens: RunOrTokens, *, aggregates: pl.LazyFrame | None = None, columns: tuple[str, ...] | None = None
) -> pl.DataFrame:
    """One row per step (see the module docstring), sorted by step.

    aggregates: the exact aggregates of all tokens (`Run.aggregates` of a sampled run, limited to
        the same steps as `tokens`): tokens, zero_adv_frac, the block rates and (when they hold
        its sum) entropy come from them.
    columns: only these columns besides step (the others are not computed)."""
    tokens, aggregates = token_rows("step_summary", tokens, aggregates)
    every_rule = checked_rules(tokens, None)
    order = [*SUMMARY_COLUMNS, *(blocked_column(r) for r in every_rule)]
    wanted = order if columns is None else [c for c in order if c in check_names("columns", columns, order)]
    if aggregates is not None:
        wanted = [c for c in wanted if c != "samples"]
    rules = [r for r in every_rule if blocked_column(r) in wanted]
    query = step_summary_query(tokens, counts=aggregates is None, rules=rules)
    rows = [c for c in wanted if c in query.collect_schema().names()]
    summary = collect(query.select("step", *rows))
    if aggregates is None:
        return summary
    steps = step_aggregates(aggregates)
    entropy = []
    if "sum_entropy" in steps.columns and "entropy" in wanted:
        n = pl.col("entropy_n")
        entropy = [pl.when(n > 0).then(pl.col("sum_entropy") / n).alias("exact_entropy")]
    exact = steps.select(
        pl.col("step").cast(summary.schema["step"]),
        pl.col("tokens").cast(pl.Int64),
        pl.when(pl.col("tokens") > 0).then(pl.col("tokens_zero") / pl.col("tokens")).alias("zero_adv_frac"),
        *(
            pl.when(pl.col(f"n_{r}") > 0).then(pl.col(f"k_{r}") / pl.col(f"n_{r}")).alias(blocked_column(r))
            for r in rules
        ),
        *entropy,
    )
    joined = exact.join(summary, on="step", how="left")
    if entropy:  # a step whose aggregates lack the entropy sum (recorded before they held it): the rows'
        joined = joined.with_columns(pl.coalesce("exact_entropy", "entropy").alias("entropy"))
    return joined.select("step", *(c for c in wanted if c in joined.columns))


__all__ = ["exact_aggregates", "step_summary", "step_summary_query"]
