"""`trustlens report RUN [RUN ...] -o report.html`: one self-contained HTML file.

The file holds plotly.js once (inlined, no CDN), its own styles and no other resource: it opens
without a network, and can be mailed or attached to an issue. Per run: overview, PPO vs DPPO on
the same tokens, mismatch, collapse alerts with their driving tokens, a colour-coded token sample
(trustlens.report.sections). Runs may be local folders or object-store URLs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trustlens.analysis.sources import require_run
from trustlens.core.argument_checks import check_path, check_str, path_arg
from trustlens.core.version import __version__
from trustlens.report.sections import esc, run_sections
from trustlens.run import load_run

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1200px; color: #222; }
nav a { margin-right: 1rem; }
h2 { border-bottom: 2px solid #ddd; padding-bottom: .3rem; margin-top: 3rem; }
table { border-collapse: collapse; margin: .5rem 0 1rem; font-size: .9rem; }
th, td { border: 1px solid #ddd; padding: .25rem .5rem; text-align: left; vertical-align: top; }
pre { white-space: pre-wrap; background: #f6f6f6; padding: .5rem; }
"""


def build_report(runs: Sequence[Any], *, title: str = "trustlens report", progress: bool = False) -> str:
    """The report of `runs` (Runs or paths) as one HTML document."""
    import plotly.offline

    check_str("title", title)
    if isinstance(runs, (str, os.PathLike)) or not isinstance(runs, (list, tuple)):
        raise TypeError(f"runs must be a list of Runs or run paths, got {type(runs).__name__} {runs!r:.80}")
    for i, r in enumerate(runs):
        if not isinstance(r, (str, os.PathLike)):
            require_run(f"build_report: runs[{i}]", r, "it")
    loaded = [load_run(r) if isinstance(r, (str, os.PathLike)) else r for r in runs]
    if not loaded:
        raise ValueError("a report needs at least one run")
    nav, bodies = [], []
    for i, run in enumerate(loaded):
        if progress:
            print(f"report: run {i + 1}/{len(loaded)} {run.name}", file=sys.stderr, flush=True)
        nav.append(f'<a href="#run{i}">{esc(run.name)}</a>')
        sections = run_sections(run)
        links = " · ".join(f'<a href="#run{i}-{anchor}">{esc(t)}</a>' for anchor, t, _ in sections)
        parts = "".join(f'<h3 id="run{i}-{anchor}">{esc(t)}</h3>{body}' for anchor, t, body in sections)
        bodies.append(f'<section id="run{i}"><h2>Run {esc(run.name)}</h2><p>{links}</p>{parts}</section>')
    made = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title><style>{STYLE}</style>"
        f"<script>{plotly.offline.get_plotlyjs()}</script></head><body>"
        f"<h1>{esc(title)}</h1><p>trustlens {esc(__version__)}, {made}. Block rates are over tokens with A ≠ 0 "
        "(a token with A = 0 carries no gradient and is never blocked).</p>"
        f"<nav>{''.join(nav)}</nav>{''.join(bodies)}</body></html>"
    )


def write_report(runs: Sequence[Any], out: str | os.PathLike, **kwargs: Any) -> Path:
    """Write the report of `runs` to `out` (an .html file); its path."""
    path = Path(check_path("out", out))
    if path.is_dir():
        raise ValueError(f"{str(path)!r} is a folder: give the report's file name, e.g. {path / 'report.html'}")
    text = build_report(runs, **kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    """Flags of `trustlens report`."""
    parser.add_argument("runs", nargs="+", metavar="RUN", help="recorded runs (folders or object-store URLs)")
    parser.add_argument("-o", "--out", type=path_arg, default=Path("report.html"), help="the HTML file [report.html]")
    parser.add_argument("--title", default="trustlens report", help="the report's title")
    parser.epilog = "What the report holds: docs/report.md"
    parser.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    path = write_report(args.runs, args.out, title=args.title, progress=True)
    print(f"report written to {path} ({path.stat().st_size / 1e6:.1f} MB): open it in a browser, no network needed")
    return 0


__all__ = ["build_report", "write_report"]
