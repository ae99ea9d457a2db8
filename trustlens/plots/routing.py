"""Figures of a mixture-of-experts run's routing: the share of tokens whose experts differ
between the engine and the trainer, per layer over steps (trustlens.analysis.routing)."""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl

from trustlens.plots.common import empty, safe_text
from trustlens.plots.numbers import RATE_FORMAT, plain_figure


@plain_figure
def routing_flips_heatmap(per_layer: pl.DataFrame, *, title: str = "Routing flips per layer") -> go.Figure:
    """The flip rate (tokens whose expert sets differ / tokens routed there) of each MoE layer
    (y) at each step (x), from `trustlens.routing.flips_per_layer`; an empty frame says the run
    recorded no routing."""
    if per_layer.is_empty():
        return empty(title, "no routing recorded (a dense run)")
    wide = per_layer.pivot(on="layer", index="step", values="flip_rate", sort_columns=True).sort("step")
    layers = [c for c in wide.columns if c != "step"]
    fig = go.Figure(
        go.Heatmap(
            x=wide["step"].to_list(),
            y=[int(c) for c in layers],
            z=[wide[c].to_list() for c in layers],
            zmin=0.0,
            colorscale="Reds",
            colorbar={"title": {"text": "flipped share"}, "tickformat": RATE_FORMAT},
            hovertemplate=f"step %{{x}} · layer %{{y}}: %{{z:{RATE_FORMAT}}} of the tokens flipped<extra></extra>",
        )
    )
    return fig.update_layout(
        title=safe_text(title), xaxis_title="step", yaxis_title="layer", height=320, margin={"t": 50, "b": 40}
    )
