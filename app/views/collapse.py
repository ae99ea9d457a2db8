"""Collapse signals: per-step signals, the alerts raised on them and the tokens behind each."""

import streamlit as st
from page_parts import alert_list, chart, header, in_steps, need_tokens
from run_queries import signals_and_alerts
from safe_display import dataframe
from sidebar import context

from trustlens import plots

ctx = need_tokens(context())
header("Collapse signals", ctx)

signals, alerts = signals_and_alerts(*ctx.key)
in_range, shown = in_steps(ctx, signals), in_steps(ctx, alerts)
chart(plots.collapse_timeline(in_range, shown), "cs_timeline", ctx=ctx)
st.caption("Signals are computed on the whole run (the sidebar's step range applies; its token filters do not).")

st.subheader(f"Alerts ({shown.height})")
alert_list(ctx, alerts, limit=50, key="cs_alert")
with st.expander("Per-step signals"):
    dataframe(in_range)
