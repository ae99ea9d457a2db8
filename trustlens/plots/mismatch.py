"""Figures of the training-inference mismatch (μ vs π_old): its quantities per step with their
trend, and one quantity per μ bucket."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from trustlens.analysis.mismatch import mismatch_trend
from trustlens.plots.common import MAX_POINTS, NOISE, empty, plain_numbers, safe_text, thin, zero_noise

# k3_kl first: a non-negative KL estimate (mismatch_kl, the K1 estimate, can be negative).
MISMATCH_CURVES = ("k3_kl", "mismatch_kl", "prob_diff_mean", "chi2_token")


def mismatch_curves(
    per_step: pl.DataFrame,
    metrics: Sequence[str] = MISMATCH_CURVES,
    *,
    reason: str | None = None,
    max_points: int = MAX_POINTS,
    title: str = "Training-inference mismatch (μ vs π_old)",
) -> go.Figure:
    """One panel per mismatch quantity over steps (`analysis.mismatch_per_step`): the per-step
    values (thin, light) and their trend (`analysis.mismatch_trend`: a centred rolling mean,
    bold), with the trend's change over the run in the panel title. An empty frame draws
    `reason` (`analysis.mismatch_unavailable`) instead."""
    if per_step.is_empty():
        return empty(title, reason or "no steps with both μ and π_old")
    missing = [m for m in metrics if m not in per_step.columns]
    if missing:
        raise ValueError(f"metrics: {missing} are not columns of the mismatch table ({per_step.columns})")
    trend = mismatch_trend(per_step, metrics)
    change = {r["metric"]: r["change"] for r in trend.summary.iter_rows(named=True)}
    df = zero_noise(thin(per_step.select("step", *metrics), max_points=max_points), metrics)
    smooth = zero_noise(thin(trend.smoothed, max_points=max_points), metrics)
    change = {m: None if c is None else (0.0 if abs(c) < NOISE else c) for m, c in change.items()}
    titles = [safe_text(m if change[m] is None else f"{m} (change over the run {change[m]:+.3g})") for m in metrics]
    fig = make_subplots(rows=len(metrics), cols=1, shared_xaxes=True, vertical_spacing=0.06, subplot_titles=titles)
    for i, m in enumerate(metrics, start=1):
        fig.add_trace(
            go.Scatter(
                x=df["step"].to_list(),
                y=df[m].to_list(),
                mode="lines",
                name="value per step",
                line={"color": "#9ecae1", "width": 1},
                showlegend=i == 1,
                legendgroup="raw",
            ),
            row=i,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=smooth["step"].to_list(),
                y=smooth[m].to_list(),
                mode="lines",
                name=safe_text(f"trend (rolling mean of {trend.window} steps)"),
                line={"color": "#08519c", "width": 2.5},
                showlegend=i == 1,
                legendgroup="trend",
            ),
            row=i,
            col=1,
        )
    fig.update_xaxes(title_text="step", row=len(metrics), col=1)
    fig.update_layout(title=safe_text(title), height=190 * len(metrics) + 120, legend={"orientation": "h", "y": -0.08})
    return plain_numbers(fig)


def mismatch_by_bucket_bar(
    by_bucket: pl.DataFrame, metric: str = "k3_kl", *, reason: str | None = None, title: str = "Mismatch by μ bucket"
) -> go.Figure:
    """Bars of one mismatch quantity per μ-probability bucket (`analysis.mismatch_by_bucket`)."""
    if by_bucket.is_empty():
        return empty(title, reason or "no tokens with both μ and π_old")
    fig = go.Figure(
        go.Bar(
            x=by_bucket["label"].to_list(),
            y=by_bucket[metric].to_list(),
            customdata=by_bucket["tokens"].to_list(),
            hovertemplate="μ in %{x}: %{y:.4g} over %{customdata} tokens<extra></extra>",
        )
    )
    fig.update_layout(title=safe_text(title), xaxis_title="μ(a_t)", yaxis_title=safe_text(metric))
    return fig
