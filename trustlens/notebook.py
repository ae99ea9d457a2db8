"""What the notebooks in notebooks/ share: figures that read on a code host, and their runs.

`setup_figures` makes every plotly figure a notebook shows carry two outputs: plotly's own JSON
(interactive in Jupyter, VS Code and JupyterLab, a few KB for the binned figures of
trustlens.plots, no JavaScript bundle) and a static SVG copy drawn by kaleido with the system's
Chromium, which is what a code host that runs no JavaScript shows (SVG: a third of a PNG's size
for these charts, and sharp). Without kaleido or a browser it keeps the JSON only and says so.

`sample_runs` loads the shipped sample (one run per rule and a learning run, `trustlens make-sample`);
when the data folder has none, it writes synthetic runs of the same rules instead and says so.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

from trustlens.run import Run, load_runs

# Environment variable that picks the figure outputs: "static" (JSON + SVG, the default) or
# "interactive" (JSON only, e.g. to execute notebooks faster in tests).
FIGURES_ENV = "TRUSTLENS_NOTEBOOK_FIGURES"
# Width of the static copies, pixels; their height is the figure's own (plotly's default 500).
STATIC_WIDTH = 900
# Rules of the synthetic stand-in for the sample, and the step its pg_is run collapses from.
FALLBACK_RULES = ("ppo", "dppo_binary_tv", "pg_is")
FALLBACK_COLLAPSE_AT = 14


def _static_works() -> str | None:
    """None when kaleido can draw a static image here, else why not."""
    try:
        import kaleido
        import plotly.graph_objects as go
        import plotly.io as pio
    except ImportError as err:
        return f"kaleido is not installed ({err})"
    warnings.filterwarnings("ignore", message="The kopts argument is ignored", category=UserWarning)
    try:
        kaleido.start_sync_server(silence_warnings=True)
        pio.to_image(go.Figure(), format="svg", width=10, height=10)
    except Exception as err:  # kaleido raises several kinds when no browser can be started
        return f"kaleido could not draw ({type(err).__name__}: {err})"
    return None


def setup_figures(mode: str | None = None) -> str:
    """Set plotly's default renderer for a notebook committed with its outputs; returns it.

    mode: "static" (plotly JSON + an SVG copy) or "interactive" (plotly JSON only); default
    $TRUSTLENS_NOTEBOOK_FIGURES, else "static". "static" falls back to "interactive" with a
    printed reason when no static image can be drawn.
    """
    import plotly.io as pio

    mode = mode or os.environ.get(FIGURES_ENV) or "static"
    if mode not in ("static", "interactive"):
        raise ValueError(f"mode must be 'static' or 'interactive', got {mode!r} (from ${FIGURES_ENV}?)")
    renderer = "plotly_mimetype"
    if mode == "static":
        reason = _static_works()
        if reason is None:
            pio.renderers["svg"].width = STATIC_WIDTH
            renderer = "plotly_mimetype+svg"
        else:
            print(f"figures are interactive only: {reason}")
    pio.renderers.default = renderer
    return renderer


def setup(figures: str | None = None) -> str:
    """Everything a notebook sets first; returns the figure renderer (`setup_figures(figures)`).

    Polars tables print up to 20 rows, 140 characters wide, strings up to 100 characters; torch
    uses one thread (the notebooks run next to other work in CI).
    """
    import polars as pl
    import torch

    torch.set_num_threads(1)
    pl.Config.set_tbl_rows(20)
    pl.Config.set_tbl_width_chars(140)
    pl.Config.set_fmt_str_lengths(100)
    return setup_figures(figures)


def sample_dir() -> Path:
    """Where the shipped sample runs live (trustlens.paths.data_path("sample_run"))."""
    from trustlens.paths import data_path

    return data_path("sample_run")


def sample_runs(folder: str | os.PathLike | None = None) -> dict[str, Run]:
    """The sample runs by directory name ("ppo", "dppo_binary_tv", "pg_is" and "learning").

    folder: a folder of runs (default `sample_dir()`). When the default has no runs, synthetic
    runs of FALLBACK_RULES are written to a temporary folder instead (the pg_is one with a
    collapse injected at step FALLBACK_COLLAPSE_AT), and a line says so.
    """
    if folder is not None:
        return {run.name: run for run in load_runs(folder)}
    try:
        found = sample_dir()
    except FileNotFoundError:
        found = None
    runs = load_runs(found) if found is not None and found.is_dir() else []
    if runs:
        return {run.name: run for run in runs}
    from trustlens.rules import RULES
    from trustlens.synthetic import write_synthetic_run

    root = Path(tempfile.mkdtemp(prefix="trustlens-sample-"))
    print(f"no shipped sample run at {found}: using synthetic runs of {', '.join(FALLBACK_RULES)} in {root}")
    rules = list(RULES)
    for i, rule in enumerate(FALLBACK_RULES):
        write_synthetic_run(
            root / rule,
            steps=24,
            samples_per_step=32,
            seq_len=48,
            rules=rules,
            seed=i,
            updates=2,
            active_rule=rule,
            collapse_at=FALLBACK_COLLAPSE_AT if rule == "pg_is" else None,
        )
    return {run.name: run for run in load_runs(root)}


__all__ = ["FIGURES_ENV", "STATIC_WIDTH", "sample_dir", "sample_runs", "setup", "setup_figures"]
