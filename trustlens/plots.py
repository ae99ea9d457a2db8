"""Plotly figures of recorded runs, shared by the dashboard and the notebooks.

Each function draws the small DataFrame an analysis query returns (trustlens.analysis), so the
caller decides what to compute and cache; none of them reads a run. Figures stay small whatever
the run's size: densities are pre-binned (at most n_x · n_y cells), bar charts show the top rows,
and curves with more than `max_points` steps are averaged over equal step bins.

Text from a run — token text, run names, rule names read from a manifest — is untrusted, and
plotly renders a subset of HTML (and LaTeX between `$…$`) in titles, labels and hover text, so
every string a figure shows goes through `safe_text` (HTML-escaped, `$` as an entity, control
characters shown as visible escapes): trace names, axis and subplot titles, and the `title`
argument of every function here (a caller may build it from a run or rule name).

Rules have one fixed colour each (`trustlens.render.rule_colour`), the same in every figure.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from trustlens.analysis.mismatch import mismatch_trend
from trustlens.render import rule_colours, series_colours, visible_text

# Curves longer than this are averaged over equal step bins.
MAX_POINTS = 2000
SEVERITY_COLOURS = {"warning": "#E69F00", "critical": "#D55E00"}
_SIDE_DASH = {"upper": "solid", "lower": "dash"}


def safe_text(text: object, *, token: bool = False) -> str:
    """`text` safe to put in a plotly label or hover text: shown literally, never as markup.

    Control and direction characters become visible escapes; with `token`, spaces are shown as
    non-breaking spaces too (so a token's leading space stays visible)."""
    shown = visible_text(None if text is None else str(text))
    if not token:
        shown = shown.replace("\u00a0", " ")
    return html.escape(shown, quote=True).replace("$", "&#36;")


def token_labels(tokens: Sequence[str | None]) -> list[str]:
    """Safe, distinct axis labels for token texts: quoted (so leading spaces show) and numbered
    when two texts would look the same."""
    seen: dict[str, int] = {}
    out = []
    for t in tokens:
        label = f"‹{safe_text(t, token=True)}›"
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} #{seen[label]}")
    return out


def _empty(title: str, reason: str | None) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=safe_text(title), xaxis_visible=False, yaxis_visible=False)
    fig.add_annotation(text=safe_text(reason or "no data"), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    return fig


def thin(df: pl.DataFrame, x: str = "step", max_points: int = MAX_POINTS) -> pl.DataFrame:
    """`df` with at most `max_points` rows: the mean of every column over equal bins of `x`
    (x itself becomes the bin's mean). Unchanged when already small."""
    if df.height <= max_points:
        return df
    lo, hi = df.select(pl.col(x).min()).item(), df.select(pl.col(x).max()).item()
    width = (hi - lo) / max_points
    numeric = [c for c, t in df.schema.items() if t.is_numeric() and c != x]
    return (
        df.with_columns(((pl.col(x) - lo) / width).floor().clip(0, max_points - 1).alias("_bin"))
        .group_by("_bin")
        .agg(pl.col(x).mean(), *(pl.col(c).mean() for c in numeric))
        .sort("_bin")
        .drop("_bin")
    )


# ---------------------------------------------------------------- Figure 1 of the DPPO paper


def _decade_ticks(lo: float, hi: float) -> dict:
    vals = list(range(math.ceil(lo), math.floor(hi) + 1))
    return {"tickvals": vals, "ticktext": [f"1e{v}" if v else "1" for v in vals]}


def _density_trace(density: pl.DataFrame, *, log_y: bool, rule: str | None, showscale: bool) -> go.Heatmap:
    """A heatmap of log10(count) on (log10 μ, y) from `figure1_density` output."""
    n_x = int(density.select(pl.col("x_bin").max()).item()) + 1
    n_y = int(density.select(pl.col("y_bin").max()).item()) + 1
    z = np.full((n_y, n_x), np.nan)
    frac = np.full((n_y, n_x), np.nan)
    xs, ys = density["x_bin"].to_numpy(), density["y_bin"].to_numpy()
    counts = density["count"].to_numpy().astype(float)
    z[ys, xs] = np.log10(counts)
    col = f"blocked_{rule}" if rule else None
    if col and col in density.columns:
        base = density["count_nonzero"].to_numpy().astype(float) if "count_nonzero" in density.columns else counts
        with np.errstate(divide="ignore", invalid="ignore"):
            frac[ys, xs] = np.where(base > 0, density[col].to_numpy() / base, np.nan)
    x_edges = _edges(density, "x_bin", "x_lo", "x_hi", n_x, log=True)
    y_edges = _edges(density, "y_bin", "y_lo", "y_hi", n_y, log=log_y)
    custom = np.dstack([10**z, frac])
    blocked_line = f"<br>blocked by {safe_text(rule)}: %{{customdata[1]:.1%}} of A ≠ 0 tokens" if col else ""
    return go.Heatmap(
        x=x_edges,
        y=y_edges,
        z=z,
        customdata=custom,
        colorscale="Viridis",
        showscale=showscale,
        colorbar={"title": "log10 tokens", "x": 1.02, "len": 0.8},
        hovertemplate="log10 μ %{x:.2f}, "
        + ("log10 π/μ" if log_y else "|π − μ|")
        + " %{y:.3g}<br>tokens: %{customdata[0]:.0f}"
        + blocked_line
        + "<extra></extra>",
    )


def _edges(density: pl.DataFrame, bin_col: str, lo_col: str, hi_col: str, n: int, *, log: bool) -> np.ndarray:
    """The n + 1 bin edges of one axis (log10 of them when `log`), from any row's edges."""
    row = density.row(0, named=True)
    lo, hi, b = row[lo_col], row[hi_col], row[bin_col]
    if log:
        lo, hi = math.log10(lo), math.log10(hi)
    width = hi - lo
    return lo - b * width + width * np.arange(n + 1)


def figure1(
    ratio_density: pl.DataFrame,
    tv_density: pl.DataFrame,
    boundaries: pl.DataFrame | None = None,
    *,
    rule: str | None = None,
    title: str = "Ratio and TV against μ (DPPO paper, Figure 1)",
) -> go.Figure:
    """The paper's Figure-1 pair: token density of π/μ (left, log scale) and of |π − μ| (right)
    against μ (log scale), with each rule's boundary (`analysis.rule_boundaries`): solid where a
    token with A > 0 starts to be blocked, dashed for A ≤ 0.

    `ratio_density` / `tv_density` come from `analysis.figure1_density(tokens, "ratio")` and
    `(tokens, "binary_tv")`; with `rule` the hover shows the fraction of each cell it blocks.
    """
    fig = make_subplots(
        rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=("ratio π/μ vs μ", "binary TV |π − μ| vs μ")
    )
    for col, (density, log_y) in enumerate(((ratio_density, True), (tv_density, False)), start=1):
        if density.is_empty():
            continue
        fig.add_trace(_density_trace(density, log_y=log_y, rule=rule, showscale=col == 2), row=1, col=col)
    if boundaries is not None and not boundaries.is_empty():
        rules = list(dict.fromkeys(boundaries["rule"].to_list()))
        colours = rule_colours(rules)
        y_ranges = {
            1: _axis_range(ratio_density, "y_lo", "y_hi", log=True),
            2: _axis_range(tv_density, "y_lo", "y_hi", log=False),
        }
        for (name, side), part in boundaries.group_by(["rule", "side"], maintain_order=True):
            for col, y in ((1, np.log10(part["ratio"].to_numpy())), (2, part["tv"].to_numpy())):
                lo, hi = y_ranges[col] or (-np.inf, np.inf)
                keep = (y >= lo) & (y <= hi)
                fig.add_trace(
                    go.Scatter(
                        x=np.log10(part["mu"].to_numpy())[keep],
                        y=y[keep],
                        mode="lines",
                        line={"color": colours[name], "dash": _SIDE_DASH[side], "width": 2},
                        name=safe_text(name),
                        legendgroup=safe_text(name),
                        showlegend=bool(col == 1 and side == "upper"),
                        hovertemplate=f"{safe_text(name)} ({side})<br>log10 μ %{{x:.2f}}, %{{y:.3g}}<extra></extra>",
                    ),
                    row=1,
                    col=col,
                )
    x_ticks = _decade_ticks(*(_axis_range(ratio_density, "x_lo", "x_hi", log=True) or (-6, 0)))
    fig.update_xaxes(title_text="μ(a_t)", **x_ticks)
    r = _axis_range(ratio_density, "y_lo", "y_hi", log=True) or (-1, 1)
    ticks = np.round(np.linspace(r[0], r[1], 5), 2)
    fig.update_yaxes(title_text="π/μ", tickvals=ticks, ticktext=[f"{10**t:.3g}" for t in ticks], row=1, col=1)
    fig.update_yaxes(title_text="|π − μ|", row=1, col=2)
    fig.update_layout(title=safe_text(title), legend={"orientation": "h", "y": -0.2})
    return fig


def _axis_range(density: pl.DataFrame, lo: str, hi: str, *, log: bool) -> tuple[float, float] | None:
    if density.is_empty():
        return None
    a, b = float(density.select(pl.col(lo).min()).item()), float(density.select(pl.col(hi).max()).item())
    return (math.log10(a), math.log10(b)) if log else (a, b)


# ---------------------------------------------------------------- what the rules block


def blocked_tokens_bar(by_token: pl.DataFrame, *, top: int = 20, title: str = "Most-blocked tokens") -> go.Figure:
    """Horizontal bars of the tokens each rule blocks most (`analysis.blocked_by_token`), grouped
    by rule; hover shows how often the token occurs and the fraction blocked."""
    if by_token.is_empty():
        return _empty(title, "no token is blocked")
    rules = list(dict.fromkeys(by_token["rule"].to_list()))
    colours = rule_colours(rules)
    order = (
        by_token.group_by("token")
        .agg(pl.col("blocked").max())
        .sort("blocked", descending=True)
        .head(top)["token"]
        .to_list()
    )
    labels = dict(zip(order, token_labels(order), strict=True))
    fig = go.Figure()
    for rule in rules:
        part = by_token.filter((pl.col("rule") == rule) & pl.col("token").is_in(order))
        fig.add_trace(
            go.Bar(
                y=[labels[t] for t in part["token"]],
                x=part["blocked"].to_list(),
                orientation="h",
                name=safe_text(rule),
                marker_color=colours[rule],
                customdata=np.column_stack([part["count"].to_numpy(), part["blocked_frac"].to_numpy()]),
                hovertemplate="%{y}<br>blocked %{x} of %{customdata[0]:.0f} (%{customdata[1]:.1%})<extra>"
                + safe_text(rule)
                + "</extra>",
            )
        )
    fig.update_layout(
        title=safe_text(title),
        barmode="group",
        xaxis_title="blocked tokens",
        yaxis={"categoryorder": "array", "categoryarray": [labels[t] for t in reversed(order)]},
        height=max(300, 22 * len(order) * max(1, len(rules)) // 2 + 120),
    )
    return fig


def blocked_by_bucket_bar(by_bucket: pl.DataFrame, *, title: str = "Blocked fraction by μ bucket") -> go.Figure:
    """Grouped bars: the fraction of tokens each rule blocks in each μ-probability bucket
    (`analysis.blocked_by_bucket`)."""
    if by_bucket.is_empty():
        return _empty(title, "no tokens")
    rules = list(dict.fromkeys(by_bucket["rule"].to_list()))
    colours = rule_colours(rules)
    fig = go.Figure()
    for rule in rules:
        part = by_bucket.filter(pl.col("rule") == rule).sort("bucket")
        fig.add_trace(
            go.Bar(
                x=part["label"].to_list(),
                y=part["blocked_frac"].to_list(),
                name=safe_text(rule),
                marker_color=colours[rule],
                customdata=np.column_stack([part["blocked"], part["count"]]),
                hovertemplate="μ in %{x}: %{y:.2%} (%{customdata[0]} of %{customdata[1]})<extra>"
                + safe_text(rule)
                + "</extra>",
            )
        )
    fig.update_layout(
        title=safe_text(title),
        barmode="group",
        xaxis_title="μ(a_t)",
        yaxis_title="blocked fraction of A ≠ 0 tokens",
        yaxis_tickformat=".0%",
    )
    return fig


def blocked_per_step_lines(
    per_step: pl.DataFrame, *, max_points: int = MAX_POINTS, title: str = "Blocked fraction per step"
) -> go.Figure:
    """One line per rule: the fraction of each step's A ≠ 0 tokens it blocks (`analysis.blocked_per_step`)."""
    if per_step.is_empty():
        return _empty(title, "no tokens")
    rules = list(dict.fromkeys(per_step["rule"].to_list()))
    colours = rule_colours(rules)
    fig = go.Figure()
    for rule in rules:
        part = thin(per_step.filter(pl.col("rule") == rule).select("step", "blocked_frac"), max_points=max_points)
        fig.add_trace(
            go.Scatter(
                x=part["step"].to_list(),
                y=part["blocked_frac"].to_list(),
                mode="lines",
                name=safe_text(rule),
                line_color=colours[rule],
            )
        )
    fig.update_layout(
        title=safe_text(title),
        xaxis_title="step",
        yaxis_title="blocked fraction of A ≠ 0 tokens",
        yaxis_tickformat=".1%",
    )
    return fig


def confusion_heatmap(matrix: pl.DataFrame, *, title: str = "Blocked by row rule, not by column rule") -> go.Figure:
    """The mask-confusion heatmap of `analysis.confusion_matrix`: cell (a, b) is the fraction of
    tokens rule a blocks and rule b lets through."""
    if matrix.is_empty():
        return _empty(title, "no rules evaluated")
    rules = list(dict.fromkeys(matrix["rule_a"].to_list()))
    idx = {r: i for i, r in enumerate(rules)}
    z = np.full((len(rules), len(rules)), np.nan)
    k = np.zeros_like(z)
    for row in matrix.iter_rows(named=True):
        i, j = idx[row["rule_a"]], idx[row["rule_b"]]
        z[i, j] = np.nan if row["only_a_frac"] is None else row["only_a_frac"]
        k[i, j] = row["only_a"]
    labels = [safe_text(r) for r in rules]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=labels,
            y=labels,
            colorscale="Reds",
            customdata=k,
            texttemplate="%{z:.1%}",
            textfont={"size": 11 if len(rules) <= 6 else 9},
            hovertemplate="blocked by %{y}, not by %{x}: %{z:.2%} of A ≠ 0 tokens (%{customdata:.0f})<extra></extra>",
            colorbar={"title": "fraction", "tickformat": ".1%"},
            xgap=1,
            ygap=1,
        )
    )
    # square-ish cells that leave room for the rule names at any number of rules
    fig.update_layout(
        title=safe_text(title),
        xaxis={"title": "not blocked by", "tickangle": -40, "automargin": True},
        yaxis={"title": "blocked by", "autorange": "reversed", "automargin": True},
        height=max(420, 34 * len(rules) + 260),
        margin={"l": 10, "r": 10},
    )
    return fig


def confusion_lines(confusion: pl.DataFrame, rule_a: str, rule_b: str, *, max_points: int = MAX_POINTS) -> go.Figure:
    """Per step, the fraction of tokens only `rule_a` blocks and only `rule_b` blocks
    (`analysis.rule_confusion(..., per_step=True)`)."""
    title = f"{rule_a} vs {rule_b} on the same tokens"
    if confusion.is_empty():
        return _empty(title, "no tokens where both rules were evaluated")
    df = thin(confusion.select("step", "only_a_frac", "only_b_frac"), max_points=max_points)
    colours = rule_colours([rule_a, rule_b])
    fig = go.Figure()
    for col, rule in (("only_a_frac", rule_a), ("only_b_frac", rule_b)):
        fig.add_trace(
            go.Scatter(
                x=df["step"].to_list(),
                y=df[col].to_list(),
                mode="lines",
                name=f"only {safe_text(rule)}",
                line_color=colours[rule],
            )
        )
    fig.update_layout(
        title=safe_text(title), xaxis_title="step", yaxis_title="fraction of A ≠ 0 tokens", yaxis_tickformat=".1%"
    )
    return fig


# ---------------------------------------------------------------- mismatch and collapse

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
        return _empty(title, reason or "no steps with both μ and π_old")
    missing = [m for m in metrics if m not in per_step.columns]
    if missing:
        raise ValueError(f"metrics: {missing} are not columns of the mismatch table ({per_step.columns})")
    trend = mismatch_trend(per_step, metrics)
    change = {r["metric"]: r["change"] for r in trend.summary.iter_rows(named=True)}
    df = thin(per_step.select("step", *metrics), max_points=max_points)
    smooth = thin(trend.smoothed, max_points=max_points)
    titles = [safe_text(m if change[m] is None else f"{m} (change over the run {change[m]:+.3g})") for m in metrics]
    fig = make_subplots(rows=len(metrics), cols=1, shared_xaxes=True, vertical_spacing=0.06, subplot_titles=titles)
    for i, m in enumerate(metrics, start=1):
        fig.add_trace(
            go.Scatter(
                x=df["step"].to_list(),
                y=df[m].to_list(),
                mode="lines",
                name=safe_text(m),
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
    return fig


def mismatch_by_bucket_bar(
    by_bucket: pl.DataFrame, metric: str = "k3_kl", *, reason: str | None = None, title: str = "Mismatch by μ bucket"
) -> go.Figure:
    """Bars of one mismatch quantity per μ-probability bucket (`analysis.mismatch_by_bucket`)."""
    if by_bucket.is_empty():
        return _empty(title, reason or "no tokens with both μ and π_old")
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


TIMELINE_SIGNALS = ("entropy", "k3_kl", "reward", "grad_norm")


def collapse_timeline(
    signals: pl.DataFrame,
    alerts: pl.DataFrame | None = None,
    *,
    panels: Sequence[str] = TIMELINE_SIGNALS,
    max_points: int = MAX_POINTS,
    title: str = "Collapse signals",
) -> go.Figure:
    """Stacked panels of the per-step signals (`analysis.step_signals`) — the given `panels`
    that the run has, then every blocked_<rule> fraction in one panel — with each alert
    (`analysis.detect_collapse`) marked on the panel of its signal, coloured by severity; the
    marker's hover text is the alert's message."""
    if signals.is_empty():
        return _empty(title, "no steps")
    blocked = [c for c in signals.columns if c.startswith("blocked_")]
    shown = [p for p in panels if p in signals.columns and signals[p].drop_nulls().len() > 0]
    rows = shown + (["blocked"] if blocked else [])
    df = thin(signals, max_points=max_points)
    fig = make_subplots(
        rows=len(rows),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.03,
        subplot_titles=[safe_text(r) if r != "blocked" else "blocked fraction of A ≠ 0 tokens" for r in rows],
    )
    row_of = {p: i for i, p in enumerate(shown, start=1)}
    for p in shown:
        fig.add_trace(
            go.Scatter(
                x=df["step"].to_list(),
                y=df[p].to_list(),
                mode="lines",
                name=safe_text(p),
                showlegend=False,
                line_color="#444",
            ),
            row=row_of[p],
            col=1,
        )
    if blocked:
        colours = rule_colours([c.removeprefix("blocked_") for c in blocked])
        for c in blocked:
            rule = c.removeprefix("blocked_")
            row_of[c] = len(rows)
            fig.add_trace(
                go.Scatter(
                    x=df["step"].to_list(),
                    y=df[c].to_list(),
                    mode="lines",
                    name=safe_text(rule),
                    line_color=colours[rule],
                ),
                row=len(rows),
                col=1,
            )
    if alerts is not None and not alerts.is_empty():
        values = {p: dict(zip(signals["step"].to_list(), signals[p].to_list(), strict=True)) for p in row_of}
        for sev, part in alerts.group_by("severity"):
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
                        text=[safe_text(a["message"]) for a in mine],
                        hovertemplate="%{text}<extra></extra>",
                    ),
                    row=row,
                    col=1,
                )
    fig.update_xaxes(title_text="step", row=len(rows), col=1)
    fig.update_layout(title=safe_text(title), height=160 * len(rows) + 120)
    return fig


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
    skipped in that panel.
    """
    ys = [y] if isinstance(y, str) else list(y)
    if not frames:
        return _empty(title, "no runs")
    fig = make_subplots(
        rows=len(ys), cols=1, shared_xaxes=True, vertical_spacing=0.05, subplot_titles=[safe_text(c) for c in ys]
    )
    colours = series_colours(list(frames))
    for i, col in enumerate(ys, start=1):
        for name, df in frames.items():
            if col not in df.columns or x not in df.columns:
                continue
            part = thin(df.select(x, col), x=x, max_points=max_points)
            fig.add_trace(
                go.Scatter(
                    x=part[x].to_list(),
                    y=part[col].to_list(),
                    mode="lines",
                    name=safe_text(name),
                    legendgroup=safe_text(name),
                    showlegend=i == 1,
                    line_color=colours[name],
                ),
                row=i,
                col=1,
            )
    fig.update_xaxes(title_text=safe_text(x), row=len(ys), col=1)
    fig.update_layout(title=safe_text(title), height=200 * len(ys) + 120)
    return fig


def accuracy_curve(accuracy: Sequence[tuple[int, float]], *, title: str = "Held-out accuracy") -> go.Figure:
    """Held-out accuracy per evaluation (`analysis.seeds.accuracy_per_step`: (step, accuracy)
    pairs), with the collapse line of `analysis.collapse.collapse_onset` dashed: half the first
    evaluation's accuracy."""
    if not accuracy:
        return _empty(title, "no held-out accuracy logged (eval/accuracy)")
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


__all__ = [
    "MAX_POINTS",
    "accuracy_curve",
    "blocked_by_bucket_bar",
    "blocked_per_step_lines",
    "blocked_tokens_bar",
    "collapse_timeline",
    "confusion_heatmap",
    "confusion_lines",
    "figure1",
    "mismatch_by_bucket_bar",
    "mismatch_curves",
    "overlay_runs",
    "safe_text",
    "thin",
    "token_labels",
]
