"""Overview: the chosen run's key figures, curves and collapse alerts."""

import page_data
import polars as pl
import streamlit as st
from page_parts import alert_list, chart, header, in_steps, need_tokens, shown_rules, step_window
from safe_display import dataframe, md
from sidebar import context
from tiles import Tiles, count, decimal, percent, scope_of_steps

from trustlens import plots
from trustlens.rules import RULES
from trustlens.run import blocked_column, rule_of_column
from views.doctor_panel import doctor_panel

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
loud = alerts.filter(alerts["severity"] != "info")  # info: an entropy change while the run learns
critical = loud.filter(loud["severity"] == "critical").height
run_scope = scope_of_steps(summary["step"][0], last["step"], ctx.steps)
last_scope = f"step {last['step']}"
tokens = int(summary["tokens"].sum())
# tokens with A ≠ 0 per step: the denominators of the block rates
live = summary["tokens"].cast(pl.Float64) * (1 - summary["zero_adv_frac"].fill_null(0.0))

routed = page_data.routing(ctx)[2]  # a mixture-of-experts run's RoutingShare, None on a dense run
tiles = Tiles((8 if accuracy else 7) + (routed is not None))
tiles.add(
    "Steps", f"{summary.height:,}", scope=run_scope, help=f"steps {summary['step'][0]}–{last['step']} in the filters"
)
tiles.add(
    "Tokens",
    count(tokens),
    exact=f"{tokens:,}",
    scope=run_scope,
    help="tokens in the filters (a sampled run: exact from its aggregates while only steps are filtered, "
    "else Σ weight of the kept rows).",
)
samples = page_data.sample_count(ctx)
if samples is not None:
    tiles.add(
        "Samples", count(samples), exact=f"{samples:,}", scope=run_scope, help="responses generated in these steps."
    )
elif ctx.run.sampled:
    kept = int(summary["samples"].sum())
    tiles.add(
        "Samples with kept rows",
        count(kept),
        exact=f"{kept:,}",
        scope=run_scope,
        help="distinct samples among the kept token rows passing the filters: a sampled run keeps only some "
        "rows, so samples whose matching tokens were all dropped are not counted.",
    )
else:
    kept = int(summary["samples"].sum())
    tiles.add("Samples", count(kept), exact=f"{kept:,}", scope=run_scope, help="distinct samples among the token rows.")
if active is not None and active in RULES and not RULES[active].blocks:
    tiles.add(
        f"Blocked by {active}",
        "never",
        scope=run_scope,
        help=f"{md(active)} masks no token: it reweights the update (docs/rules.md).",
    )
elif active is not None and blocked_column(active) in summary.columns:
    denominator = float(live.sum())
    frac = float((summary[blocked_column(active)].fill_null(0.0) * live).sum()) / denominator if denominator else None
    tiles.add(
        f"Blocked by {active}",
        percent(frac),
        exact=None if frac is None else f"{frac:.6%}",
        scope=run_scope,
        help="share of the (filtered) A ≠ 0 tokens of these steps the active rule blocks (a token with "
        "A = 0 carries no gradient and is never blocked); n/a when every token had A = 0.",
    )
else:
    tiles.add("Blocked", "n/a", scope=run_scope, help="no rule was evaluated.")
tiles.add(
    "Reward",
    decimal(reward),
    exact=None if reward is None else f"{reward:.6g}",
    scope=last_scope,
    help="mean reward of the last step in the filters.",
)
tiles.add(
    "Alerts",
    f"{loud.height}",
    scope=run_scope,
    delta=f"{critical} critical" if critical else None,
    delta_color="inverse",
    help="warning and critical collapse alerts in these steps (Collapse signals lists them in time order; "
    f"{alerts.height - loud.height} info notes of an entropy change while the run learned are not counted).",
)
zero = float((summary["zero_adv_frac"].fill_null(0.0) * summary["tokens"]).sum()) / tokens if tokens else None
tiles.add(
    "A = 0 tokens",
    percent(zero),
    exact=None if zero is None else f"{zero:.6%}",
    scope=run_scope,
    help="share of the (filtered) tokens of these steps with advantage 0: no gradient, not in block rates "
    "(a group whose responses all got the same reward has A = 0).",
)
if routed is not None:
    tiles.add(
        "Flipped tokens",
        percent(routed.flipped_share),
        exact=f"{routed.flipped_share:.6%}",
        scope="run",
        help="share of the run's tokens the trainer routed to other experts than the engine in at least one MoE "
        "layer (weighted in a sampled run); they carry "
        + ("—" if routed.k3_share is None else f"{routed.k3_share:.1%}")
        + " of the run's k3 (the Mismatch page: by routing; the doctor's routing check).",
    )
if accuracy:
    (first_step, first), (last_step, final) = accuracy[0], accuracy[-1]
    # the evaluation after the last trained step is logged at the next step, which has no tokens:
    # named after the step it follows, as the Reward tile beside it names that step
    after = last_step > last["step"]
    tiles.add(
        "Accuracy",
        f"{final:.3f}",
        scope=f"after step {last['step']}" if after else f"step {last_step}",
        delta=f"{final - first:+.3f}",
        help=f"held-out accuracy (eval/accuracy) at step {last_step}, the last evaluation in the filters' "
        + (f"steps (the final one, run after the last trained step {last['step']})" if after else "steps")
        + f"; the change since the first there, at step {first_step}.",
    )

# every rule in the block-rate chart (the active and the compared one drawn, the others a legend
# click away), at full width so that its legend fits under it; the timeline beside the accuracy
# draws those two only
shown = shown_rules(ctx)
chart(plots.blocked_per_step_lines(blocked, shown=shown), "ov_blocked", ctx=ctx)
others = [c for c in signals.columns if rule_of_column(c) is not None and rule_of_column(c) not in shown]
left, right = st.columns(2)
with left:
    chart(plots.collapse_timeline(signals.drop(others), alerts, panels=("entropy", "reward")), "ov_timeline", ctx=ctx)
if accuracy:
    with right:
        chart(plots.accuracy_curve(accuracy), "ov_accuracy")

st.subheader("Alerts")
alert_list(ctx, alerts, limit=8, key="ov_alert")

doctor_panel(ctx)

with st.expander("Per-step summary"):
    dataframe(summary, percent=plots.rate_columns(summary))
with st.expander("Run manifest"):
    st.json(ctx.run.manifest, expanded=1)
