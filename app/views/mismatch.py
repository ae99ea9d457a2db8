"""Mismatch: how far the trainer's π_old is from the rollout engine's μ."""

import page_data
import streamlit as st
from page_parts import chart, header, need_tokens
from safe_display import dataframe, md, number
from sidebar import context

from trustlens import plots
from trustlens.analysis import MISMATCH_COLUMNS, mismatch_trend

ctx = need_tokens(context())
header("Mismatch", ctx)

reason, per_step, by_bucket = page_data.mismatch(ctx)
if reason is not None or per_step is None or by_bucket is None:
    st.info(f"The training-inference mismatch cannot be measured here: {md(reason)}.")
    st.stop()

# k3_kl first: a KL estimate that is never negative (mismatch_kl, the K1 estimate, can be). A
# sampled run keeps only some tokens of a response, so its sequence-level log_ppl_abs_diff is a
# rough estimate (3× the full run's on a test run): the exact prob_diff_mean takes its tile.
SEQUENCE_TILE = "prob_diff_mean" if ctx.run.sampled else "log_ppl_abs_diff"
TILES = ("k3_kl", "mismatch_kl", SEQUENCE_TILE, "chi2_token", "prob_diff_max", "prob_pearson")
last = per_step.row(-1, named=True)
change = dict(mismatch_trend(per_step, TILES).summary.select("metric", "change").iter_rows())
cols = st.columns(len(TILES))
for col, name in zip(cols, TILES, strict=True):
    value, delta = last.get(name), change.get(name)
    col.metric(
        name,
        number(value, 3),
        delta=None if delta is None else f"{'+' if delta >= 0 else ''}{number(delta, 3)} over the run",
        delta_color="off",
        help=f"step {last['step']}: {MISMATCH_COLUMNS[name]}. The change is that of the trend line below.",
    )

chart(plots.mismatch_curves(per_step), "mm_curves", ctx=ctx)
metric = st.selectbox(
    "By μ bucket",
    ("k3_kl", "mismatch_kl", "chi2_token", "prob_diff_mean", "prob_diff_max", "prob_pearson"),
    key="mm_metric",
    help="Mismatch within each μ-probability bucket",
)
chart(plots.mismatch_by_bucket_bar(by_bucket, metric), "mm_bucket")
with st.expander("Per-step mismatch table"):
    dataframe(per_step)
    st.caption(" · ".join(f"{k}: {v}" for k, v in MISMATCH_COLUMNS.items()))
