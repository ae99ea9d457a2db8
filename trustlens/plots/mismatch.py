"""Figures of the training-inference mismatch (μ vs π_old): its quantities per step with their
trend, and one quantity per μ bucket."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from trustlens.analysis.mismatch import mismatch_trend
from trustlens.core.numbers import decimal, noise_to_zero
from trustlens.plots.common import MAX_POINTS, empty, legend_beside, safe_text, thin
from trustlens.plots.numbers import plain_figure, scale_of, zero_noise

# k3_kl first: a non-negative KL estimate (mismatch_kl, the K1 estimate, can be negative).
MISMATCH_CURVES = ("k3_kl", "mismatch_kl", "prob_diff_mean", "chi2_token")


@plain_figure
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
    bold), the panel titled with the quantity and its trend's first and last value, and a legend
    of its own beside it. Values below the noise floor of their column's scale are drawn and
    titled as 0 (`numbers.zero_noise`). An empty frame draws `reason`
    (`analysis.mismatch_unavailable`) instead."""
    if per_step.is_empty():
        return empty(title, reason or "no steps with both μ and π_old")
    missing = [m for m in metrics if m not in per_step.columns]
    if missing:
        raise ValueError(f"metrics: {missing} are not columns of the mismatch table ({per_step.columns})")
    trend = mismatch_trend(per_step, metrics)
    df = zero_noise(thin(per_step.select("step", *metrics), max_points=max_points), metrics)
    smooth = zero_noise(thin(trend.smoothed, max_points=max_points), metrics)
    ends = {r["metric"]: r for r in trend.summary.iter_rows(named=True)}
    titles = [safe_text(_panel_title(m, ends.get(m), scale=scale_of(per_step[m]))) for m in metrics]
    fig = make_subplots(rows=len(metrics), cols=1, shared_xaxes=True, vertical_spacing=0.06, subplot_titles=titles)
    for i, m in enumerate(metrics, start=1):
        legend = "legend" if i == 1 else f"legend{i}"
        for frame, name, line in (
            (df, "per step", {"color": "#9ecae1", "width": 1}),
            (smooth, f"trend ({trend.window}-step mean)", {"color": "#08519c", "width": 2.5}),
        ):
            fig.add_trace(
                go.Scatter(
                    x=frame["step"].to_list(),
                    y=frame[m].to_list(),
                    mode="lines",
                    name=safe_text(name),
                    line=line,
                    legend=legend,
                ),
                row=i,
                col=1,
            )
        legend_beside(fig, i, legend, title_text=safe_text(m))
    fig.update_xaxes(title_text="step", row=len(metrics), col=1)
    fig.update_layout(title=safe_text(title), height=190 * len(metrics) + 120)
    return fig


def _panel_title(metric: str, ends: dict | None, *, scale: float) -> str:
    """ "k3_kl: trend 8.94e-5 → 9.14e-5 over the run": the trend's first and last value, each 0
    below the noise floor of the column's `scale`; the bare name without a trend."""
    if ends is None or ends["first"] is None or ends["last"] is None:
        return metric
    first, last = (noise_to_zero(ends[k], scale) for k in ("first", "last"))
    return f"{metric}: trend {decimal(first)} → {decimal(last)} over the run"


@plain_figure
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
            hovertemplate="μ in %{x}: %{y:.3~g} over %{customdata:,} tokens<extra></extra>",
        )
    )
    fig.update_layout(title=safe_text(title), xaxis_title="μ(a_t)", yaxis_title=safe_text(metric))
    return fig
