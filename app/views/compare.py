"""Compare runs: several runs' per-step curves overlaid."""

from pathlib import Path

import streamlit as st
import trustlens_ui as ui

from trustlens import plots


@st.cache_data(ttl=ui.RUN_TTL, max_entries=64, show_spinner=False)
def run_signals(path: str, signature: tuple):
    run = ui.run_at(path, signature)
    if ui.tokens_of(run) is None:
        return None
    return ui.signals_and_alerts(path, signature)[0]


ctx = ui.context()
if ctx is None:
    st.stop()
st.title("Compare runs")
names = {str(p): (p.name if p == ctx.root else str(p.relative_to(ctx.root))) for p in ctx.runs}
chosen = ui.multiselect_in_address("Runs", names, key="cr_runs", param="compare", default=list(names)[:4])
frames, empty = {}, []
for path in chosen:
    signals = run_signals(path, ui.run_signature(Path(path)))
    if signals is None:
        empty.append(names[path])
    else:
        frames[names[path]] = signals
if empty:
    st.info("No token rows yet in: " + ", ".join(ui.md(n) for n in empty))
if not frames:
    st.info("Pick runs with token rows to compare them.")
    st.stop()
columns = sorted({c for df in frames.values() for c in df.columns if c != "step"})
defaults = [c for c in ("reward", "entropy", "k3_kl") if c in columns] or columns[:1]
ys = st.multiselect("Signals", columns, default=defaults, key="cr_signals")
if ys:
    ui.chart(plots.overlay_runs(frames, ys), "cr_overlay")
