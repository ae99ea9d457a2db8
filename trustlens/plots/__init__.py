"""Plotly figures of recorded runs, shared by the dashboard and the notebooks.

Each function draws the small DataFrame an analysis query returns (trustlens.analysis), so the
caller decides what to compute and cache; none of them reads a run. Figures stay small whatever
the run's size: densities are pre-binned (at most n_x · n_y cells), bar charts show the top rows,
and curves with more than `max_points` steps are averaged over equal step bins.

Modules:
    common     what every figure shares: safe_text and token_labels for the text it shows, thin
               for long curves, the figure of an empty frame, MAX_POINTS and SEVERITY_COLOURS
    blocking   what the rules block: the DPPO paper's Figure 1, the most-blocked tokens, the
               blocked fraction by μ bucket and per step, and two rules' masks compared
    mismatch   training-inference mismatch (μ vs π_old) per step and per μ bucket
    runs       a run's collapse signals and alerts, its held-out accuracy, and runs overlaid
    routing    a mixture-of-experts run's routing flips per layer over steps
    numbers    the one number format of figures, tiles, tables and the report: plain decimals or
               1.6e-4 (never SI prefixes), rates in percent, float noise as 0; every figure
               function here returns its figure through plain_numbers

Text from a run — token text, run names, rule names read from a manifest — is untrusted, and
plotly renders a subset of HTML (and LaTeX between `$…$`) in titles, labels and hover text, so
every string a figure shows goes through `safe_text` (HTML-escaped, `$` as an entity, control
characters shown as visible escapes): trace names, axis and subplot titles, and the `title`
argument of every function here (a caller may build it from a run or rule name).

Rules have one fixed colour each (`trustlens.core.render.rule_colour`), the same in every figure.
"""

from trustlens.core.numbers import NOISE, count, decimal, is_rate, noise_floor, noise_to_zero, percent, signed
from trustlens.plots.blocking import (
    blocked_by_bucket_bar,
    blocked_per_step_lines,
    blocked_tokens_bar,
    confusion_heatmap,
    confusion_lines,
    figure1,
)
from trustlens.plots.common import (
    MAX_POINTS,
    SEVERITY_COLOURS,
    drawn,
    legend_below,
    legend_beside,
    safe_text,
    thin,
    token_labels,
)
from trustlens.plots.mismatch import MISMATCH_CURVES, mismatch_by_bucket_bar, mismatch_curves
from trustlens.plots.numbers import RATE_FORMAT, plain_figure, plain_numbers, rate_columns, scale_of, zero_noise
from trustlens.plots.routing import routing_flips_heatmap
from trustlens.plots.runs import TIMELINE_SIGNALS, accuracy_curve, collapse_timeline, overlay_runs

__all__ = [
    "MAX_POINTS",
    "MISMATCH_CURVES",
    "NOISE",
    "RATE_FORMAT",
    "SEVERITY_COLOURS",
    "TIMELINE_SIGNALS",
    "accuracy_curve",
    "blocked_by_bucket_bar",
    "blocked_per_step_lines",
    "blocked_tokens_bar",
    "collapse_timeline",
    "confusion_heatmap",
    "confusion_lines",
    "count",
    "decimal",
    "drawn",
    "figure1",
    "is_rate",
    "legend_below",
    "legend_beside",
    "mismatch_by_bucket_bar",
    "mismatch_curves",
    "noise_floor",
    "noise_to_zero",
    "overlay_runs",
    "percent",
    "plain_figure",
    "plain_numbers",
    "rate_columns",
    "routing_flips_heatmap",
    "safe_text",
    "scale_of",
    "signed",
    "thin",
    "token_labels",
    "zero_noise",
]
