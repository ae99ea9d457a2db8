"""Figures of what the rules block: the DPPO paper's Figure 1 (token density against μ with each
rule's boundary), the most-blocked tokens, the blocked fraction by μ bucket and per step, and
two rules' masks compared (confusion_heatmap, confusion_lines). Each rule keeps its colour
(`trustlens.core.render.rule_colours`)."""

from __future__ import annotations

import math
from collections.abc import Collection

import numpy as np
import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from trustlens.core.render import rule_colours
from trustlens.plots.common import MAX_POINTS, drawn, empty, legend_below, rate_line, safe_text, thin, token_labels
from trustlens.plots.numbers import RATE_FORMAT, plain_figure
from trustlens.run import blocked_column

_SIDE_DASH = {"upper": "solid", "lower": "dash"}


# ---------------------------------------------------------------- Figure 1 of the DPPO paper


def _decade_ticks(lo: float, hi: float) -> dict:
    vals = list(range(math.ceil(lo), math.floor(hi) + 1))
    return {"tickvals": vals, "ticktext": [f"1e{v}" if v else "1" for v in vals]}


def _density_trace(density: pl.DataFrame, *, log_y: bool, rule: str | None, showscale: bool, anchor: str) -> go.Heatmap:
    """A heatmap of log10(count) on (log10 anchor, y) from `figure1_density` output."""
    n_x = int(density.select(pl.col("x_bin").max()).item()) + 1
    n_y = int(density.select(pl.col("y_bin").max()).item()) + 1
    z = np.full((n_y, n_x), np.nan)
    frac = np.full((n_y, n_x), np.nan)
    xs, ys = density["x_bin"].to_numpy(), density["y_bin"].to_numpy()
    counts = density["count"].to_numpy().astype(float)
    z[ys, xs] = np.log10(counts)
    col = blocked_column(rule) if rule else None
    if col and col in density.columns:
        base = density["count_nonzero"].to_numpy().astype(float) if "count_nonzero" in density.columns else counts
        with np.errstate(divide="ignore", invalid="ignore"):
            frac[ys, xs] = np.where(base > 0, density[col].to_numpy() / base, np.nan)
    x_edges = _edges(density, "x_bin", "x_lo", "x_hi", n_x, log=True)
    y_edges = _edges(density, "y_bin", "y_lo", "y_hi", n_y, log=log_y)
    custom = np.dstack([10**z, frac])
    blocked_line = f"<br>blocked by {safe_text(rule)}: %{{customdata[1]:{RATE_FORMAT}}} of A ≠ 0 tokens" if col else ""
    return go.Heatmap(
        x=x_edges,
        y=y_edges,
        z=z,
        customdata=custom,
        colorscale="Viridis",
        showscale=showscale,
        colorbar={"title": "log10 tokens", "x": 1.02, "len": 0.8},
        hovertemplate=f"log10 {anchor} %{{x:.2f}}, "
        + (f"log10 π/{anchor}" if log_y else f"|π − {anchor}|")
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


@plain_figure
def figure1(
    ratio_density: pl.DataFrame,
    tv_density: pl.DataFrame,
    boundaries: pl.DataFrame | None = None,
    *,
    rule: str | None = None,
    title: str = "Ratio and TV against μ (DPPO paper, Figure 1)",
    anchor: str = "μ",
) -> go.Figure:
    """The paper's Figure-1 pair: token density of π/μ (left, log scale) and of |π − μ| (right)
    against μ (log scale), with each rule's boundary (`analysis.rule_boundaries`): solid where a
    token with A > 0 starts to be blocked, dashed for A < 0.

    `ratio_density` / `tv_density` come from `analysis.figure1_density(tokens, "ratio")` and
    `(tokens, "binary_tv")`; with `rule` the hover shows the fraction of each cell it blocks.
    `anchor`: the symbol of the anchor policy on the axes ("π_old" for a run without μ, whose
    densities are against π_old: `analysis.anchor_column`).
    """
    a = safe_text(anchor)
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.12,
        subplot_titles=(f"ratio π/{a} vs {a}", f"binary TV |π − {a}| vs {a}"),
    )
    for col, (density, log_y) in enumerate(((ratio_density, True), (tv_density, False)), start=1):
        if density.is_empty():
            continue
        trace = _density_trace(density, log_y=log_y, rule=rule, showscale=col == 2, anchor=a)
        fig.add_trace(trace, row=1, col=col)
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
                        hovertemplate=f"{safe_text(name)} ({side})<br>log10 {a} %{{x:.2f}}, %{{y:.3g}}<extra></extra>",
                    ),
                    row=1,
                    col=col,
                )
    x_ticks = _decade_ticks(*(_axis_range(ratio_density, "x_lo", "x_hi", log=True) or (-6, 0)))
    fig.update_xaxes(title_text=f"{a}(a_t)", **x_ticks)
    r = _axis_range(ratio_density, "y_lo", "y_hi", log=True) or (-1, 1)
    ticks = np.round(np.linspace(r[0], r[1], 5), 2)
    fig.update_yaxes(title_text=f"π/{a}", tickvals=ticks, ticktext=[f"{10**t:.3g}" for t in ticks], row=1, col=1)
    fig.update_yaxes(title_text=f"|π − {a}|", row=1, col=2)
    fig.update_layout(title=safe_text(title), legend={"orientation": "h", "y": -0.2})
    return fig


def _axis_range(density: pl.DataFrame, lo: str, hi: str, *, log: bool) -> tuple[float, float] | None:
    if density.is_empty():
        return None
    a, b = float(density.select(pl.col(lo).min()).item()), float(density.select(pl.col(hi).max()).item())
    return (math.log10(a), math.log10(b)) if log else (a, b)


# ---------------------------------------------------------------- what the rules block


@plain_figure
def blocked_tokens_bar(by_token: pl.DataFrame, *, top: int = 20, title: str = "Most-blocked tokens") -> go.Figure:
    """Horizontal bars of the tokens each rule blocks most (`analysis.blocked_by_token`), grouped
    by rule; hover shows how often the token occurs and the fraction blocked."""
    if by_token.is_empty():
        return empty(title, "no token is blocked")
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
                hovertemplate=f"%{{y}}<br>blocked %{{x:,}} of %{{customdata[0]:,.0f}} "
                f"(%{{customdata[1]:{RATE_FORMAT}}})<extra>{safe_text(rule)}</extra>",
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


@plain_figure
def blocked_by_bucket_bar(
    by_bucket: pl.DataFrame, *, title: str = "Blocked fraction by μ bucket", anchor: str = "μ"
) -> go.Figure:
    """Grouped bars: the fraction of tokens each rule blocks in each μ-probability bucket
    (`analysis.blocked_by_bucket`); `anchor` names the anchor policy on the axis ("π_old" for a
    run without μ)."""
    a = safe_text(anchor)
    if by_bucket.is_empty():
        return empty(title, "no tokens")
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
                hovertemplate=f"{a} in %{{x}}: %{{y:{RATE_FORMAT}}} (%{{customdata[0]:,}} of "
                f"%{{customdata[1]:,}})<extra>{safe_text(rule)}</extra>",
            )
        )
    fig.update_layout(
        title=safe_text(title),
        barmode="group",
        xaxis_title=f"{a}(a_t)",
        yaxis_title="blocked fraction of A ≠ 0 tokens",
        yaxis_tickformat=RATE_FORMAT,
    )
    return fig


@plain_figure
def blocked_per_step_lines(
    per_step: pl.DataFrame,
    *,
    shown: Collection[str] | None = None,
    max_points: int = MAX_POINTS,
    title: str = "Blocked fraction per step",
) -> go.Figure:
    """One line per rule: the fraction of each step's A ≠ 0 tokens it blocks (`analysis.blocked_per_step`).
    `shown`: the rules drawn (e.g. the run's active rule and the one compared with it); the others
    are listed in the legend, one click away (None: every rule drawn). The legend sits under the
    plot."""
    if per_step.is_empty():
        return empty(title, "no tokens")
    rules = list(dict.fromkeys(per_step["rule"].to_list()))
    colours = rule_colours(rules)
    fig = go.Figure()
    for rule in rules:
        part = thin(per_step.filter(pl.col("rule") == rule).select("step", "blocked_frac"), max_points=max_points)
        fig.add_trace(rate_line(part, "blocked_frac", rule, colours[rule], visible=drawn(rule, shown)))
    fig.update_layout(
        title=safe_text(title),
        xaxis_title="step",
        yaxis_title="blocked fraction of A ≠ 0 tokens",
        yaxis_tickformat=RATE_FORMAT,
    )
    return legend_below(fig)


@plain_figure
def confusion_heatmap(matrix: pl.DataFrame, *, title: str = "Blocked by row rule, not by column rule") -> go.Figure:
    """The mask-confusion heatmap of `analysis.confusion_matrix`: cell (a, b) is coloured by the
    fraction of A ≠ 0 tokens rule a blocks and rule b lets through and prints their count (the
    rate on hover)."""
    if matrix.is_empty():
        return empty(title, "no rules evaluated")
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
            # counts (rates of 0.0x % all print as "0.0 %"); as text: heatmap cells cannot print customdata
            text=[[f"{v:,.0f}" for v in line] for line in k],
            texttemplate="%{text}",
            textfont={"size": 11 if len(rules) <= 6 else 9},
            hovertemplate=f"blocked by %{{y}}, not by %{{x}}: %{{z:{RATE_FORMAT}}} of A ≠ 0 tokens "
            "(%{text})<extra></extra>",
            colorbar={"title": "share", "tickformat": RATE_FORMAT},
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


@plain_figure
def confusion_lines(confusion: pl.DataFrame, rule_a: str, rule_b: str, *, max_points: int = MAX_POINTS) -> go.Figure:
    """Per step, the fraction of tokens only `rule_a` blocks and only `rule_b` blocks
    (`analysis.rule_confusion(..., per_step=True)`)."""
    title = f"{rule_a} vs {rule_b} on the same tokens"
    if confusion.is_empty():
        return empty(title, "no tokens where both rules were evaluated")
    df = thin(confusion.select("step", "only_a_frac", "only_b_frac"), max_points=max_points)
    colours = rule_colours([rule_a, rule_b])
    fig = go.Figure()
    for col, rule in (("only_a_frac", rule_a), ("only_b_frac", rule_b)):
        fig.add_trace(rate_line(df, col, f"only {rule}", colours[rule]))
    fig.update_layout(
        title=safe_text(title),
        xaxis_title="step",
        yaxis_title="fraction of A ≠ 0 tokens",
        yaxis_tickformat=RATE_FORMAT,
    )
    return fig
