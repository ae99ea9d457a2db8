"""Collapse signals: per-step signals, the alerts raised on them and the tokens behind each."""

import streamlit as st
import trustlens_ui as ui

from trustlens import plots

ctx = ui.need_tokens(ui.context())
ui.header("Collapse signals", ctx)

signals, alerts = ui.signals_and_alerts(*ctx.key)
lo, hi = ctx.shown_steps
in_range = signals.filter(signals["step"].is_between(lo, hi))
ui.chart(plots.collapse_timeline(in_range, alerts), "cs_timeline", ctx=ctx)
st.caption("Signals are computed on the whole run (the sidebar's step range applies; its token filters do not).")

st.subheader(f"Alerts ({alerts.height})")
ui.alert_list(ctx, alerts, limit=50, key="cs_alert")
with st.expander("Per-step signals"):
    ui.dataframe(in_range)
