"""What every figure module shares: `safe_text` and `token_labels` for the text a figure shows
(see the package docstring), `thin` for curves longer than `MAX_POINTS` steps, `empty` for the
figure of an empty frame, `legend_beside` to put a panel's legend next to it and `legend_below`
to put a long one under the plot, `drawn` for the rules drawn among many (the others one legend
click away), `rate_line` for the line of a per-step rate, and the alert colours
(`SEVERITY_COLOURS`)."""

from __future__ import annotations

import html
import math
from collections.abc import Collection, Sequence
from typing import Any, Literal

import plotly.graph_objects as go
import polars as pl

from trustlens.core.render import quoted_token, visible_text
from trustlens.plots.numbers import RATE_FORMAT

# plotly's figure height when none is set, and the height of one row of a legend, px
DEFAULT_HEIGHT = 450
LEGEND_ROW_PX = 20
# the width of the text of one entry of a legend under the plot: the longest rule name at 11 px
LEGEND_ENTRY_PX = 150
# Curves longer than this are averaged over equal step bins.
MAX_POINTS = 2000
SEVERITY_COLOURS = {"info": "#56B4E9", "warning": "#E69F00", "critical": "#D55E00"}


def legend_beside(fig: go.Figure, row: int, legend: str = "legend", **style) -> go.Figure:
    """Place `legend` right of subplot `row` (of a one-column `make_subplots` figure), its top level
    with the panel's: the legend of one panel sits beside that panel, not beside the first one.
    `style`: more of the legend's settings (a title, ...)."""
    axis = fig.layout[f"yaxis{row if row > 1 else ''}"]
    top = axis.domain[1] if axis.domain else 1.0
    fig.update_layout({legend: {"x": 1.02, "xanchor": "left", "y": top, "yanchor": "top", **style}})
    return fig


def legend_below(fig: go.Figure, legend: str = "legend", **style) -> go.Figure:
    """Lay `legend` out under the plot in rows of entries LEGEND_ENTRY_PX wide (two a row in a
    400 px figure, more when wider), left-aligned, below the x axis title, so that a long legend
    (a dozen rules) takes no width from a narrow plot; the figure grows by LEGEND_ROW_PX per row of
    two, so the plot keeps its height. `style`: more of the legend's settings."""
    entries = sum(1 for trace in fig.data if (trace.legend or "legend") == legend and trace.showlegend is not False)
    below = {
        "orientation": "h",
        "entrywidth": LEGEND_ENTRY_PX,  # two entries a row from 400 px wide, more when wider
        "entrywidthmode": "pixels",
        "font": {"size": 11},
        "itemwidth": 30,  # the line beside each name: plotly's narrowest
        "x": 0,
        "xref": "container",
        "xanchor": "left",
        "y": 0,
        "yref": "container",
        "yanchor": "bottom",
    }
    height = (fig.layout.height or DEFAULT_HEIGHT) + LEGEND_ROW_PX * math.ceil(entries / 2)
    # the right margin of a legend beside the plot is not needed: the plot takes the width
    fig.update_layout({legend: {**below, **style}, "height": height, "margin": {"r": 24}})
    return fig


def drawn(name: str, shown: Collection[str] | None) -> bool | Literal["legendonly"]:
    """A trace's `visible`: drawn when `shown` is None or holds `name`, else listed in the legend
    only, where one click draws it."""
    return True if shown is None or name in shown else "legendonly"


def rate_line(df: pl.DataFrame, column: str, name: str, colour: str, **style: Any) -> go.Scatter:
    """The line of a per-step rate: `column` of `df` against its "step", named `name` (shown
    literally), in `colour`, its hover "step s: r %" under the name. `style`: more of the trace's
    settings (`visible`, `legend`, ...)."""
    label = safe_text(name)
    return go.Scatter(
        x=df["step"].to_list(),
        y=df[column].to_list(),
        mode="lines",
        name=label,
        line_color=colour,
        hovertemplate=f"step %{{x}}: %{{y:{RATE_FORMAT}}}<extra>{label}</extra>",
        **style,
    )


def safe_text(text: object) -> str:
    """`text` safe to put in a plotly label or hover text: shown literally, never as markup.
    Control and direction characters become visible escapes, no-break spaces plain spaces (a
    token's spaces are shown as ␣ by `token_labels`)."""
    shown = visible_text(None if text is None else str(text)).replace("\u00a0", " ")
    return html.escape(shown, quote=True).replace("$", "&#36;")


def token_labels(tokens: Sequence[str | None]) -> list[str]:
    """Safe, distinct axis labels for token texts, spelt as every page spells a token
    (`quoted_token`: spaces as ␣, between ‹ and ›), numbered when two texts would look the same."""
    seen: dict[str, int] = {}
    out = []
    for t in tokens:
        label = safe_text(quoted_token(t))
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} #{seen[label]}")
    return out


def empty(title: str, reason: str | None) -> go.Figure:
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
