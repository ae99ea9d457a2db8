"""The headline tiles of the dashboard's pages: short values that fit a tile at 1,280 px, the exact
value on hover, and a label that says what the value covers (the run, or one step).

The number format is the one of every figure and the report (trustlens.plots.numbers): counts
shortened with k and M (307k, 1.2M); percentages as percentages (2.2 %); other values as plain
decimals with 3 significant digits, or in scientific notation (1.6e-4) below 1e-3 and from 1e4
on; never SI prefixes (a μ on a page about μ reads as the rollout policy, not as micro).
"""

from __future__ import annotations

import math

import streamlit as st
from safe_display import md

from trustlens.core.numbers import NOISE, count, decimal, noise_to_zero, percent

# tiles per row: four fit the main column beside the sidebar at 1,280 px
PER_ROW = 4

# Let tile labels wrap (long rule names included) instead of ending in an ellipsis.
TILE_CSS = """
<style>
[data-testid="stMetricLabel"] div, [data-testid="stMetricLabel"] p {
  white-space: normal !important; overflow: visible !important; text-overflow: clip !important;
  overflow-wrap: anywhere;
}
</style>
"""


def scope_of_steps(lo: int, hi: int, whole: tuple[int, int] | None) -> str:
    """What a value over steps lo..hi covers: "run" when that is every step of the run."""
    return "run" if whole is not None and (lo, hi) == tuple(whole) else f"steps {lo}–{hi}"


class Tiles:
    """Rows of PER_ROW tiles, filled left to right: `add(label, value, scope=…, exact=…, help=…)`."""

    def __init__(self, n: int):
        st.markdown(TILE_CSS, unsafe_allow_html=True)  # static CSS, no run text
        self.cols = [c for _ in range(math.ceil(n / PER_ROW)) for c in st.columns(PER_ROW)]
        self.next = 0

    def add(self, label: str, value: str, *, scope: str, help: str, exact: str | None = None, **metric) -> None:
        """One tile: `label` (run text escaped) with its `scope` ("run", "step 249", ...), the short
        `value`, and on hover `help` with the `exact` value when it was shortened."""
        col = self.cols[self.next]
        self.next += 1
        shown = f"{help} Exact value: {exact}." if exact is not None and exact != value else help
        col.metric(f"{md(label)} · {md(scope)}", value, help=shown, **metric)


__all__ = ["NOISE", "PER_ROW", "Tiles", "count", "decimal", "noise_to_zero", "percent", "scope_of_steps"]
