"""PPO vs DPPO: any two rules compared on the same tokens."""

from dataclasses import replace

import page_data
import polars as pl
import streamlit as st
from page_parts import chart, header, inspect_tokens, need_tokens
from rule_groups import by_level, level_label, rule_level
from run_queries import decidable_rules
from safe_display import md
from sidebar import context

from trustlens import plots
from trustlens.analysis.agreement import default_rule_pair

# rules the mask-confusion matrix shows at first, and at most (the rest one click away)
MATRIX_RULES, MATRIX_MOST = 6, 10

ctx = need_tokens(context())
header("PPO vs DPPO", ctx)
# the recorded rules, then registry rules decided on the run's columns (counterfactually), grouped:
# token rules, then the sequence rules that decide whole responses, then the (recorded) batch rules
specs = ctx.run.rules
choices = by_level(ctx.rules + decidable_rules(ctx), specs)
if len(choices) < 2:
    st.info("This run holds fewer than two rules' decisions: there is nothing to compare.")
    st.stop()


def rule_label(rule: str) -> str:
    label = level_label(rule, specs)
    return label if rule in ctx.rules else f"{label} (decided on the recorded columns)"


default_a, default_b = default_rule_pair(choices)
c1, c2 = st.columns(2)
rule_a = c1.selectbox("Rule A", choices, index=choices.index(default_a), key="pv_a", format_func=rule_label)
rule_b = c2.selectbox("Rule B", choices, index=choices.index(default_b), key="pv_b", format_func=rule_label)
if rule_a == rule_b:
    st.warning("Pick two different rules.")
    st.stop()

data = page_data.ppo_vs_dppo(ctx, rule_a, rule_b)
if data["total"].is_empty() or data["total"]["count"][0] == 0:
    st.warning("No token has a decision from both rules in these filters.")
    st.stop()
t = data["total"].row(0, named=True)
cols = st.columns(5)
# a sampled run counts every token only from its aggregates: with steps filtered only, for recorded rules
estimated = ctx.run.sampled and not (ctx.exact and rule_a in ctx.rules and rule_b in ctx.rules)
cols[0].metric(
    "Tokens compared (estimate)" if estimated else "Tokens compared",
    f"{t['count']:,}",
    help="A ≠ 0 tokens where both rules were evaluated"
    + (
        ": Σ weight of the kept rows of this sampled run (its aggregates count only recorded rules, over steps)"
        if estimated
        else ""
    ),
)
cols[1].metric("Blocked by both", f"{t['both']:,}")
cols[2].metric(f"Only {md(rule_a)}", f"{t['only_a']:,}", help=f"{plots.percent(t['only_a_frac'])} of the A ≠ 0 tokens")
cols[3].metric(f"Only {md(rule_b)}", f"{t['only_b']:,}", help=f"{plots.percent(t['only_b_frac'])} of the A ≠ 0 tokens")
cols[4].metric("Agreement", plots.percent(t["agreement"]), help="share of the compared tokens both rules decide alike")
# a sequence rule blocks whole responses: its decision counted once per response
for row in data["responses"].iter_rows(named=True):
    if rule_level(row["rule"], specs) == "sequence" and row["responses"]:
        st.caption(
            f"{md(row['rule'])} decides per response: it blocks {row['blocked_responses']:,} of the "
            f"{row['responses']:,} responses with A ≠ 0 as a whole ({plots.percent(row['blocked_frac'])}), "
            "every token of a blocked response included in the counts above."
        )

if rule_a in ctx.rules and rule_b in ctx.rules:
    b1, b2 = st.columns(2)
    for col, (blocked_a, label) in zip((b1, b2), ((True, f"only {rule_a}"), (False, f"only {rule_b}")), strict=True):
        if col.button(f"Inspect tokens blocked by {label}", key=f"pv_inspect_{blocked_a}", icon=":material/search:"):
            decisions = ((rule_a, blocked_a), (rule_b, not blocked_a))
            inspect_tokens(reason=f"tokens blocked by {label}", query=replace(ctx.query, decisions=decisions))
else:
    st.caption("The token inspector filters on recorded decisions: pick two recorded rules to open their tokens.")

chart(plots.confusion_lines(data["per_step"], rule_a, rule_b), "pv_lines", ctx=ctx)
chart(
    plots.figure1(
        data["ratio_density"],
        data["tv_density"],
        data["boundaries"],
        rule=rule_a,
        title=f"Ratio and TV against {ctx.anchor_name} (DPPO paper, Figure 1)",
        anchor=ctx.anchor_name,
    ),
    "pv_figure1",
)
# their denominators count every token, which a sampled run's aggregates do not split this way
kept = " (estimate)" if ctx.run.sampled else ""
if kept:
    st.caption("Charts marked (estimate): on this sampled run, Σ weight of the kept rows.")
left, right = st.columns(2)
with left:
    chart(
        plots.blocked_by_bucket_bar(
            data["by_bucket"], title=f"Blocked fraction by {ctx.anchor_name} bucket{kept}", anchor=ctx.anchor_name
        ),
        "pv_bucket",
    )
with right:
    chart(plots.blocked_tokens_bar(data["by_token"]), "pv_tokens")
# full width, the chosen rules only (rules A and B, the active rule, up to MATRIX_RULES in all), the others
# one click away: up to MATRIX_MOST rules, a cell per pair whose count fits it at 1,280 px
recorded = by_level(ctx.rules, specs)
default = [r for r in dict.fromkeys((rule_a, rule_b, ctx.run.active_rule, *recorded)) if r in ctx.rules]
shown = st.multiselect(
    "Rules in the matrix",
    recorded,
    default=default[:MATRIX_RULES],
    max_selections=MATRIX_MOST,
    format_func=rule_label,
    help=f"the recorded rules the matrix compares, at most {MATRIX_MOST} (their counts then fit their cells)",
)
matrix = data["matrix"].filter(pl.col("rule_a").is_in(shown) & pl.col("rule_b").is_in(shown))
chart(plots.confusion_heatmap(matrix, title=f"Blocked by row rule, not by column rule{kept}"), "pv_matrix")
