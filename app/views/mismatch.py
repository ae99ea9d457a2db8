"""Mismatch: how far the trainer's π_old is from the rollout engine's μ."""

import page_data
import streamlit as st
import trustlens_ui as ui

from trustlens import plots
from trustlens.analysis import MISMATCH_COLUMNS

ctx = ui.need_tokens(ui.context())
ui.header("Mismatch", ctx)

reason, per_step, by_bucket = page_data.mismatch(ctx)
if reason is not None:
    st.info(f"The training-inference mismatch cannot be measured here: {ui.md(reason)}.")
    st.stop()

last = per_step.row(-1, named=True)
shown = ("mismatch_kl", "k3_kl", "log_ppl_diff", "chi2_token", "tv_max", "pearson")
cols = st.columns(len(shown))
for col, name in zip(cols, shown):
    value = last.get(name)
    col.metric(name, "n/a" if value is None else f"{value:.3g}", help=f"step {last['step']}: {MISMATCH_COLUMNS[name]}")

ui.chart(plots.mismatch_curves(per_step), "mm_curves", ctx=ctx)
metric = st.selectbox(
    "By μ bucket",
    ("k3_kl", "mismatch_kl", "chi2_token", "tv_mean", "tv_max", "pearson"),
    key="mm_metric",
    help="Mismatch within each μ-probability bucket",
)
ui.chart(plots.mismatch_by_bucket_bar(by_bucket, metric), "mm_bucket")
with st.expander("Per-step mismatch table"):
    st.dataframe(per_step, hide_index=True)
    st.caption(" · ".join(f"{k}: {v}" for k, v in MISMATCH_COLUMNS.items()))
