"""The per-step signals a run's collapse alerts (`trustlens.analysis.collapse`) watch.

`step_signals` builds one row per step from the three tables of a run:

    entropy        mean entropy of π over the step's tokens (nats)
    k3_kl, prob_diff_mean training-inference mismatch (trustlens.analysis.mismatch; null without μ)
    reward         mean reward of the step's samples
    accuracy       held-out accuracy (the metric named `eval/accuracy`, mean over ranks, as
                   the collapse test of trustlens.analysis.onset reads it); null at steps
                   without an evaluation
    grad_norm      the `grad_norm` metric (the mean over ranks of any metric named `grad_norm` or
                   ending in `/grad_norm`)
    blocked_<rule> fraction of the step's A ≠ 0 tokens each rule blocks
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from trustlens.analysis.buckets import checked_rules, collect
from trustlens.analysis.inputs import require_run
from trustlens.analysis.mismatch import mismatch_per_step
from trustlens.analysis.onset import evaluations
from trustlens.analysis.summary import exact_aggregates, step_summary
from trustlens.run import blocked_column


def _metric_per_step(metrics: pl.LazyFrame, name: str) -> pl.LazyFrame:
    """Mean over ranks of the metric `name` (or any metric ending in `/name`) per step."""
    return (
        metrics.filter((pl.col("name") == name) | pl.col("name").str.ends_with("/" + name))
        .group_by("step")
        .agg(pl.col("value").mean().alias(name))
    )


def step_signals(run, rules: str | Sequence[str] | None = None) -> pl.DataFrame:
    """One row per step (module docstring): step, entropy, k3_kl, prob_diff_mean, reward,
    accuracy, grad_norm, blocked_<rule>…; null where a run lacks the source. `run` has .tokens, .samples
    and .metrics LazyFrames (a `trustlens.run.Run`); a sampled run's block rates and mismatch
    come from its exact aggregates. `rules`: the rules whose blocked_<rule> columns are computed
    (None: every rule the run evaluated; the live alerts watch only the active rule's)."""
    run = require_run("step_signals", run)
    tokens = run.tokens
    rules = checked_rules(tokens, rules)
    aggregates = exact_aggregates(run)
    per_step = step_summary(tokens, aggregates=aggregates, columns=("entropy", *(blocked_column(r) for r in rules)))
    mm = mismatch_per_step(tokens, aggregates=aggregates).select("step", "k3_kl", "prob_diff_mean")
    reward = run.samples.group_by("step").agg(pl.col("reward").mean().cast(pl.Float64))
    out = per_step.lazy()  # one query for the joins: a step's few rows cost a collect's overhead, not its work
    for other in (mm.lazy(), reward, evaluations(run.metrics), _metric_per_step(run.metrics, "grad_norm")):
        out = out.join(other.with_columns(pl.col("step").cast(pl.Int32)), on="step", how="full", coalesce=True)
    cols = [
        "entropy",
        "k3_kl",
        "prob_diff_mean",
        "reward",
        "accuracy",
        "grad_norm",
        *(blocked_column(r) for r in rules),
    ]
    return collect(
        out.with_columns(pl.col("step").cast(pl.Int32))
        .select("step", *(pl.col(c).cast(pl.Float64) for c in cols))
        .sort("step")
    )


__all__ = ["step_signals"]
