"""The per-step signals a run's collapse alerts (`trustlens.analysis.collapse`) watch.

`step_signals` builds one row per step from the three tables of a run:

    entropy        mean entropy of π over the step's tokens (nats)
    k3_kl, prob_diff_mean training-inference mismatch (trustlens.analysis.mismatch; null without μ)
    reward         mean reward of the step's samples
    accuracy       held-out accuracy (the metric named `eval/accuracy`, mean over ranks, as
                   the collapse test of trustlens.analysis.collapse.onset reads it); null at steps
                   without an evaluation
    grad_norm      the `grad_norm` metric (the mean over ranks of any metric named `grad_norm` or
                   ending in `/grad_norm`)
    blocked_<rule> fraction of the step's A ≠ 0 tokens each rule blocks

A run that holds only metrics (imported: `trustlens import`) has them read from its logged
metrics instead (trustlens.analysis.collapse.logged).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import polars as pl

from trustlens.analysis.buckets import blocked_rate, checked_rules, collect, weighted_mean
from trustlens.analysis.collapse.logged import logged_signals, metric_per_step, metrics_only
from trustlens.analysis.collapse.onset import evaluations
from trustlens.analysis.mismatch import mismatch_per_step, token_mismatch
from trustlens.analysis.sources import require_run
from trustlens.analysis.summary import exact_aggregates, step_summary
from trustlens.run import blocked_column

_MISMATCH = ("k3_kl", "prob_diff_mean")  # the mismatch columns of the signals


@functools.lru_cache(maxsize=64)
def _token_signals(rules: tuple[str, ...], weights: bool, mu: bool) -> tuple[pl.Expr, ...]:
    """The aggregations of a step's token rows into its entropy, mismatch and block rates (the
    definitions of step_summary and mismatch_per_step), built once per table shape: a live
    monitor asks every step."""
    mismatch = token_mismatch(weights=weights) if mu else [pl.lit(None, pl.Float64).alias(c) for c in _MISMATCH]
    return (
        weighted_mean(pl.col("entropy"), weights=weights).alias("entropy"),
        *mismatch,
        *(blocked_rate(r, weights=weights) for r in rules),
    )


def _token_per_step(run, tokens: pl.LazyFrame, rules: list[str]) -> pl.LazyFrame:
    """step, entropy, k3_kl, prob_diff_mean, blocked_<rule>… per step: from the token rows in one
    pass, or for a sampled run from its exact aggregates (step_summary, mismatch_per_step)."""
    aggregates = exact_aggregates(run)
    if aggregates is None:
        mu = "mu_logp" in tokens.collect_schema().names()
        return tokens.group_by("step").agg(*_token_signals(tuple(rules), False, mu))
    summary = step_summary(tokens, aggregates=aggregates, columns=("entropy", *(blocked_column(r) for r in rules)))
    mm = mismatch_per_step(tokens, aggregates=aggregates).select("step", *_MISMATCH)
    steps = pl.col("step").cast(pl.Int32)
    return summary.lazy().with_columns(steps).join(mm.lazy().with_columns(steps), on="step", how="full", coalesce=True)


def step_signals(run, rules: str | Sequence[str] | None = None) -> pl.DataFrame:
    """One row per step (module docstring): step, entropy, k3_kl, prob_diff_mean, reward,
    accuracy, grad_norm, blocked_<rule>…; null where a run lacks the source. `run` has .tokens, .samples
    and .metrics LazyFrames (a `trustlens.run.Run`); a sampled run's block rates and mismatch
    come from its exact aggregates. `rules`: the rules whose blocked_<rule> columns are computed
    (None: every rule the run evaluated; the live alerts watch only the active rule's)."""
    run = require_run("step_signals", run)
    if metrics_only(run):  # imported from a log: its logged metrics (trustlens.analysis.collapse.logged)
        return logged_signals(run, rules)
    tokens = run.tokens
    rules = checked_rules(tokens, rules)
    out = _token_per_step(run, tokens, rules).with_columns(pl.col("step").cast(pl.Int32))
    reward = run.samples.group_by("step").agg(pl.col("reward").mean().cast(pl.Float64))
    for other in (reward, evaluations(run.metrics), metric_per_step(run.metrics, "grad_norm")):
        out = out.join(other.with_columns(pl.col("step").cast(pl.Int32)), on="step", how="full", coalesce=True)
    cols = [
        "entropy",
        *_MISMATCH,
        "reward",
        "accuracy",
        "grad_norm",
        *(blocked_column(r) for r in rules),
    ]
    # one query for everything: a step's few rows (the live monitor) cost a collect's overhead, not its work
    return collect(out.select("step", *(pl.col(c).cast(pl.Float64) for c in cols)).sort("step"))


__all__ = ["step_signals"]
