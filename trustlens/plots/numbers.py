"""One number format for every figure, tile, table and report: the text formats of
`trustlens.core.numbers` (re-exported here), plus figures' axes, colour bars and tables.

- Plain decimals with 3 significant digits, in scientific notation below 1e-3 and from 1e4 on
  (1.6e-4, never 1.6e-04), never SI prefixes: plotly's default ticks write 6f, 10n and 200μ,
  and on a page about μ a "μ" reads as the rollout policy, not as micro (`decimal`, and
  `plain_numbers` for a figure's axes and colour bars).
- Counts shortened with k and M (307k, 1.2M) (`count`).
- Fractions of tokens — block rates, shares — as percentages (2.2 %): `percent` in text,
  `RATE_FORMAT` on axes and in hover text, chosen by the column's name (`is_rate`).
- |values| below `NOISE` of their scale (the unit, or the series' largest |value| when that is
  larger) are float rounding — k3 of 1.8e-15 where μ = π_old — and are drawn and shown as 0, not
  as a trend (`noise_to_zero`, `zero_noise`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import ParamSpec

import plotly.graph_objects as go
import polars as pl

from trustlens.core.numbers import is_rate, noise_floor

# d3 format of a fraction on an axis or in hover text: a percentage with 3 significant digits,
# trailing zeros dropped (0.0213 → 2.13%, 0.05 → 5%)
RATE_FORMAT = ".3~p"
# plotly's exponent format: 1e-4, never the SI prefixes of its default ("B")
EXPONENT_FORMAT = "e"

P = ParamSpec("P")


def rate_columns(df: pl.DataFrame) -> list[str]:
    """The float columns of `df` whose names are rates (`is_rate`): those a table shows in percent."""
    return [c for c, t in df.schema.items() if t.is_float() and is_rate(c)]


def zero_noise(df: pl.DataFrame, columns: Sequence[str]) -> pl.DataFrame:
    """`df` with every value of `columns` below the noise floor of its column's scale (its
    largest |value|, at least 1) set to 0: float rounding drawn as zero, not as a trend."""
    floors = {c: noise_floor(scale_of(df[c])) for c in columns}
    return df.with_columns(
        pl.when(pl.col(c).abs() < floors[c]).then(0.0).otherwise(pl.col(c)).alias(c) for c in columns
    )


def scale_of(values: pl.Series) -> float:
    """The scale of a series for `noise_floor`: its largest finite |value| (0.0 when none is finite)."""
    finite = values.filter(values.is_finite()).abs()
    return float(finite.max() or 0.0) if finite.len() else 0.0  # type: ignore[arg-type]


def plain_numbers(fig: go.Figure) -> go.Figure:
    """`fig` with every axis's and colour bar's ticks in plain decimals or scientific notation
    (2e-4), never SI prefixes; an axis with its own tick format (a percentage) keeps it."""
    fig.update_xaxes(exponentformat=EXPONENT_FORMAT)
    fig.update_yaxes(exponentformat=EXPONENT_FORMAT)
    fig.update_coloraxes(colorbar_exponentformat=EXPONENT_FORMAT)
    for trace in fig.data:
        if "colorbar" in trace:
            trace.update(colorbar_exponentformat=EXPONENT_FORMAT)
    return fig


def plain_figure(build: Callable[P, go.Figure]) -> Callable[P, go.Figure]:
    """Decorator of a figure function: the figure it returns goes through `plain_numbers`."""

    @functools.wraps(build)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> go.Figure:
        return plain_numbers(build(*args, **kwargs))

    return wrapped
