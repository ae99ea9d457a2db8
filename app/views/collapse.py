"""Collapse signals: the run's timeline (its first signal, what followed, the collapse and the
tokens behind each), the per-step signals and the alerts raised on them."""

import polars as pl
import streamlit as st
from page_parts import alert_box, chart, header, in_steps, need_steps, shown_rules
from run_cache import RUN_TTL, run_at
from run_queries import signals_and_alerts
from safe_display import dataframe, md
from sidebar import Context, context

from trustlens import plots
from trustlens.analysis import tokens as tq
from trustlens.analysis.collapse.logged import metrics_only
from trustlens.analysis.collapse.timeline import run_timeline
from trustlens.core.render import quoted_token

# driving tokens named per timeline entry
DRIVERS_SHOWN = 5
EVENT_LABELS = {"first signal": "First signal", "then": "Then", "note": "Note", "collapse": "Collapse"}


@st.cache_data(ttl=RUN_TTL, max_entries=32, show_spinner=False)
def timeline(path: str, signature: tuple) -> pl.DataFrame:
    return run_timeline(run_at(path, signature), signals_and_alerts(path, signature)[1])


@st.cache_data(ttl=RUN_TTL, max_entries=256, show_spinner=False)
def driving_tokens(path: str, signature: tuple, row: int) -> list[str]:
    """The text of the first DRIVERS_SHOWN driving tokens of alert `row`."""
    run = run_at(path, signature)
    if metrics_only(run):  # imported: no token rows to point at
        return []
    alert = signals_and_alerts(path, signature)[1].row(row, named=True)
    found = tq.alert_tokens(run.tokens, alert)
    return [quoted_token(t) for t in found["token"].head(DRIVERS_SHOWN).to_list()] if "token" in found else []


def show_timeline(ctx: Context, alerts: pl.DataFrame) -> None:
    events = in_steps(ctx, timeline(*ctx.key))
    if events.is_empty():
        st.success("No collapse signal and no collapse in these steps.")
        return
    for i, event in enumerate(events.iter_rows(named=True)):
        lead = f"**step {event['step']} · {EVENT_LABELS[event['event']]}** · "
        if event["alert"] is None:
            with st.container(border=True):  # not st.error: the collapse is a finding, not a failure
                st.markdown(f":material/trending_down: {lead}:red[**{md(event['message'])}**]")
            continue
        tokens = driving_tokens(*ctx.key, event["alert"])
        drivers = "driving tokens: " + ", ".join(md(t) for t in tokens) if tokens else ""
        alert_box(alerts.row(event["alert"], named=True), f"cs_timeline_{i}", lead=lead, drivers=drivers)


ctx = need_steps(context())
header("Collapse signals", ctx)

signals, alerts = signals_and_alerts(*ctx.key)
in_range, raised = in_steps(ctx, signals), in_steps(ctx, alerts)
st.subheader("Timeline")
st.caption(
    "The first warning or critical alert, what followed and the collapse (held-out accuracy below half its "
    "first evaluation, or the mean reward below half its start), in time order; info notes are entropy "
    "changes while accuracy or reward rose."
)
show_timeline(ctx, alerts)
chart(plots.collapse_timeline(in_range, raised, shown=shown_rules(ctx)), "cs_timeline", ctx=ctx)
st.caption("Signals are computed on the whole run (the sidebar's step range applies; its token filters do not).")
with st.expander("Per-step signals"):
    dataframe(in_range, percent=plots.rate_columns(in_range))
