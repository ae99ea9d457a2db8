"""Overview: the chosen run's key figures, curves and collapse alerts."""

import page_data
import streamlit as st
from page_parts import alert_list, chart, header, in_steps, need_tokens, step_window
from safe_display import dataframe, md
from sidebar import context

from trustlens import plots
from trustlens.rules import RULES

ctx = need_tokens(context())
header("Overview", ctx)

summary, blocked, signals, alerts, accuracy = page_data.overview(ctx)
# the whole run's signals, alerts and evaluations, limited to the sidebar's steps like the rest
signals, alerts = in_steps(ctx, signals), in_steps(ctx, alerts)
window_lo, window_hi = step_window(ctx)
accuracy = [(step, value) for step, value in accuracy if window_lo <= step <= window_hi]
if summary.is_empty():
    st.warning("No token matches the sidebar filters.")
    st.stop()

active = ctx.run.active_rule if ctx.run.active_rule in ctx.rules else (ctx.rules[0] if ctx.rules else None)
last = summary.row(-1, named=True)
last_signals = signals.filter(signals["step"] <= last["step"]).tail(1).to_dicts()
reward = last_signals[0].get("reward") if last_signals else None
critical = alerts.filter(alerts["severity"] == "critical").height

cols = st.columns(8 if accuracy else 7)
cols[0].metric("Steps", f"{summary.height}", help=f"steps {summary['step'][0]}–{last['step']} in the filters")
cols[1].metric(
    "Tokens",
    f"{int(summary['tokens'].sum()):,}",
    help="tokens in the filters (a sampled run: exact from its aggregates while only steps are filtered, "
    "else Σ weight of the kept rows)",
)
samples = page_data.sample_count(ctx)
if samples is not None:
    cols[2].metric("Samples", f"{samples:,}", help="responses generated in the steps in the filters")
elif ctx.run.sampled:
    cols[2].metric(
        "Samples with kept rows",
        f"{int(summary['samples'].sum()):,}",
        help="distinct samples among the kept token rows passing the filters: a sampled run keeps only some "
        "rows, so samples whose matching tokens were all dropped are not counted",
    )
else:
    cols[2].metric("Samples", f"{int(summary['samples'].sum()):,}", help="distinct samples among the token rows")
if active is not None and active in RULES and not RULES[active].blocks:
    cols[3].metric(
        f"Blocked by {md(active)}",
        "never",
        help=f"{md(active)} masks no token: it reweights the update (docs/rules.md)",
    )
elif active is not None:
    frac = last.get(f"blocked_{active}")
    cols[3].metric(
        f"Blocked by {md(active)}",
        "n/a" if frac is None else f"{frac:.2%}",
        help="fraction of the last step's (filtered) A ≠ 0 tokens the active rule blocks "
        "(a token with A = 0 carries no gradient and is never blocked)",
    )
else:
    cols[3].metric("Blocked", "n/a", help="no rule was evaluated")
zero = last.get("zero_adv_frac")
cols[6].metric(
    "A = 0 tokens",
    "n/a" if zero is None else f"{zero:.1%}",
    help="share of the last step's (filtered) tokens with advantage 0: no gradient, not in block rates",
)
cols[4].metric("Reward", "n/a" if reward is None else f"{reward:.3g}", help="mean reward of the last step")
cols[5].metric("Alerts", f"{alerts.height}", delta=f"{critical} critical" if critical else None, delta_color="inverse")
if accuracy:
    (first_step, first), (last_step, final) = accuracy[0], accuracy[-1]
    cols[7].metric(
        "Accuracy",
        f"{final:.3f}",
        delta=f"{final - first:+.3f}",
        help=f"held-out accuracy (eval/accuracy) at step {last_step}, the last evaluation in the filters' "
        f"steps; the change since the first there, at step {first_step}",
    )

left, right = st.columns(2)
with left:
    chart(plots.blocked_per_step_lines(blocked), "ov_blocked", ctx=ctx)
with right:
    chart(plots.collapse_timeline(signals, alerts, panels=("entropy", "reward")), "ov_timeline", ctx=ctx)
if accuracy:
    left, _ = st.columns(2)
    with left:
        chart(plots.accuracy_curve(accuracy), "ov_accuracy")

st.subheader("Alerts")
alert_list(ctx, alerts, limit=8, key="ov_alert")

with st.expander("Per-step summary"):
    dataframe(summary)
with st.expander("Run manifest"):
    st.json(ctx.run.manifest, expanded=1)
