"""Figures of a run over its steps and of runs compared: the collapse signals with their alerts,
the held-out accuracy with the collapse line, and several runs' per-step columns overlaid."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from trustlens.core.numbers import is_rate
from trustlens.core.render import rule_colours, series_colours
from trustlens.plots.common import (
    MAX_POINTS,
    SEVERITY_COLOURS,
    drawn,
    empty,
    legend_below,
    legend_beside,
    rate_line,
    safe_text,
    thin,
)
from trustlens.plots.numbers import RATE_FORMAT, plain_figure
from trustlens.run import rule_of_column

TIMELINE_SIGNALS = ("entropy", "k3_kl", "reward", "accuracy", "grad_norm")
# collapse_timeline: the height of one panel, and the gap above each panel (its title's room), px
PANEL_PX = 160
TITLE_GAP_PX = 44


def _line(df: pl.DataFrame, x: str, y: str, max_points: int) -> dict:
    """The x, y and mode of a line through the rows of `df` (sorted by `x`) where `y` has a
    value, thinned to `max_points`: a sparse column (accuracy: logged at the evaluations only)
    is joined across its gaps, with a marker on each value."""
    gap = pl.col(y).is_null() & pl.col(y).forward_fill().is_not_null() & pl.col(y).backward_fill().is_not_null()
    sparse = df.select(gap.any()).item()
    points = thin(df.select(x, y).drop_nulls(), x=x, max_points=max_points)
    return {"x": points[x].to_list(), "y": points[y].to_list(), "mode": "lines+markers" if sparse else "lines"}


@plain_figure
def collapse_timeline(
    signals: pl.DataFrame,
    alerts: pl.DataFrame | None = None,
    *,
    panels: Sequence[str] = TIMELINE_SIGNALS,
    shown: Collection[str] | None = None,
    max_points: int = MAX_POINTS,
    title: str = "Collapse signals",
) -> go.Figure:
    """Stacked panels of the per-step signals (`analysis.step_signals`) — the given `panels`
    that the run has, then every blocked_<rule> fraction in one panel — with each alert
    (`analysis.detect_collapse`) marked on the panel of its signal, coloured by severity; the
    marker's hover text is the alert's message. A panel's line joins the steps that have a value
    (accuracy: the evaluations, marked). `shown`: the rules drawn in the block-rate panel (in
    percent), the others listed in its legend, one click away (None: every rule). The rules'
    legend sits under the figure, the alerts' beside the first panel with an alert. Panels are
    spaced so that each one's title clears the tick labels of the panel above."""
    if signals.is_empty():
        return empty(title, "no steps")
    blocked = [c for c in signals.columns if rule_of_column(c) is not None]
    present = [p for p in panels if p in signals.columns and signals[p].drop_nulls().len() > 0]
    rows = present + (["blocked"] if blocked else [])
    height = PANEL_PX * len(rows) + 120
    fig = make_subplots(
        rows=len(rows),
        cols=1,
        shared_xaxes=True,
        # TITLE_GAP_PX of the plot area (the figure less its margins) between two panels
        vertical_spacing=min(TITLE_GAP_PX / (height - 180), 0.3),
        subplot_titles=[safe_text(r) if r != "blocked" else "blocked fraction of A ≠ 0 tokens" for r in rows],
    )
    row_of = {p: i for i, p in enumerate(present, start=1)} | {c: len(rows) for c in blocked}
    for p in present:
        fig.add_trace(
            go.Scatter(
                **_line(signals, "step", p, max_points),
                name=safe_text(p),
                showlegend=False,
                line_color="#444",
            ),
            row=row_of[p],
            col=1,
        )
    if blocked:
        _add_block_rates(fig, signals, blocked, len(rows), shown, max_points)
    alert_rows = [] if alerts is None else sorted({row_of[s] for s in alerts["signal"].to_list() if s in row_of})
    # the alerts' legend beside the first panel with an alert: the rules' one when that is theirs
    alert_legend = "legend2" if alert_rows and blocked and alert_rows[0] == len(rows) else "legend"
    if alerts is not None and alert_rows:
        _add_alerts(fig, signals, alerts, row_of, alert_legend)
    fig.update_xaxes(title_text="step", row=len(rows), col=1)
    fig.update_layout(title=safe_text(title), height=height)
    if blocked:  # the rules' legend under the figure; the block-rate panel (the last) in percent
        legend_below(fig, "legend2")
        fig.update_yaxes(tickformat=RATE_FORMAT, row=len(rows), col=1)
    if alert_legend == "legend" and alert_rows:
        legend_beside(fig, alert_rows[0])
    return fig


def _add_block_rates(
    fig: go.Figure,
    signals: pl.DataFrame,
    blocked: list[str],
    row: int,
    shown: Collection[str] | None,
    max_points: int,
) -> None:
    """`collapse_timeline`'s block-rate panel (`row`): one line per blocked_<rule> column of
    `signals`, drawn when `shown` has its rule (None: every rule), in the rules' legend."""
    colours = rule_colours([str(rule_of_column(c)) for c in blocked])
    df = thin(signals.select("step", *blocked), max_points=max_points)
    for c in blocked:
        rule = str(rule_of_column(c))
        # the rules' legend sits under the figure, the alerts' beside a panel
        line = rate_line(df, c, rule, colours[rule], visible=drawn(rule, shown), legend="legend2")
        fig.add_trace(line, row=row, col=1)


def _add_alerts(
    fig: go.Figure, signals: pl.DataFrame, alerts: pl.DataFrame, row_of: dict[str, int], legend: str
) -> None:
    """`collapse_timeline`'s alert markers: per severity and panel (`row_of`: signal -> row), one
    trace of the alerts at their signal's value, hover text the alert's message, in `legend`."""
    values = {p: dict(zip(signals["step"].to_list(), signals[p].to_list(), strict=True)) for p in row_of}
    for sev, part in alerts.group_by("severity", maintain_order=True):
        pts = [(row_of.get(a["signal"]), a) for a in part.iter_rows(named=True)]
        for row in sorted({r for r, _ in pts if r is not None}):
            mine = [a for r, a in pts if r == row]
            fig.add_trace(
                go.Scatter(
                    x=[a["step"] for a in mine],
                    y=[values[a["signal"]].get(a["step"]) for a in mine],
                    mode="markers",
                    marker={"symbol": "x", "size": 11, "color": SEVERITY_COLOURS.get(sev[0], "#000")},
                    name=f"{sev[0]} alert",
                    legendgroup=sev[0],
                    showlegend=row == min(r for r, _ in pts if r),
                    legend=legend,
                    text=[safe_text(a["message"]) for a in mine],
                    hovertemplate="%{text}<extra></extra>",
                ),
                row=row,
                col=1,
            )


@plain_figure
def overlay_runs(
    frames: Mapping[str, pl.DataFrame],
    y: str | Sequence[str],
    *,
    x: str = "step",
    max_points: int = MAX_POINTS,
    title: str = "Runs compared",
) -> go.Figure:
    """Several runs overlaid: for each column in `y`, one panel with a line per run.

    `frames` maps a run's name to a per-step frame holding `x` and the `y` columns (e.g.
    `step_summary`, `mismatch_per_step` or `step_signals` of each run). Runs lacking a column are
    skipped in that panel; a sparse column (accuracy) is joined across its evaluations, marked; a
    rate column (`numbers.is_rate`) is drawn in percent. The runs' legend, which every panel
    shares, sits level with the first panel.
    """
    ys = [y] if isinstance(y, str) else list(y)
    if not frames:
        return empty(title, "no runs")
    fig = make_subplots(
        rows=len(ys), cols=1, shared_xaxes=True, vertical_spacing=0.05, subplot_titles=[safe_text(c) for c in ys]
    )
    colours = series_colours(list(frames))
    for i, col in enumerate(ys, start=1):
        for name, df in frames.items():
            if col not in df.columns or x not in df.columns:
                continue
            fig.add_trace(
                go.Scatter(
                    **_line(df, x, col, max_points),
                    name=safe_text(name),
                    legendgroup=safe_text(name),
                    showlegend=i == 1,
                    line_color=colours[name],
                    hovertemplate=f"{safe_text(x)} %{{x}}: %{{y:{RATE_FORMAT if is_rate(col) else '.3~g'}}}"
                    f"<extra>{safe_text(name)}</extra>",
                ),
                row=i,
                col=1,
            )
        if is_rate(col):
            fig.update_yaxes(tickformat=RATE_FORMAT, row=i, col=1)
    fig.update_xaxes(title_text=safe_text(x), row=len(ys), col=1)
    fig.update_layout(title=safe_text(title), height=200 * len(ys) + 120)
    return legend_beside(fig, 1)  # one line per run in every panel: the runs' legend level with the first


@plain_figure
def accuracy_curve(accuracy: Sequence[tuple[int, float]], *, title: str = "Held-out accuracy") -> go.Figure:
    """Held-out accuracy per evaluation (`analysis.seeds.accuracy_per_step`: (step, accuracy)
    pairs), with the collapse line of `analysis.onset.collapse_onset` dashed: half the first
    evaluation's accuracy."""
    if not accuracy:
        return empty(title, "no held-out accuracy logged (eval/accuracy)")
    steps, values = zip(*sorted(accuracy), strict=True)
    fig = go.Figure(go.Scatter(x=list(steps), y=list(values), mode="lines+markers", name="accuracy"))
    fig.add_hline(
        y=values[0] / 2,
        line_dash="dash",
        line_color=SEVERITY_COLOURS["critical"],
        annotation_text="collapse line: half the start",
        annotation_position="top right",
    )
    fig.update_layout(title=safe_text(title), xaxis_title="step", yaxis_title="accuracy", height=320)
    fig.update_yaxes(rangemode="tozero")
    return fig
