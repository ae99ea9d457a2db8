"""Token inspector: one response as coloured tokens, the rows behind a filter, alert or chart."""

import page_data
import polars as pl
import streamlit as st
from page_parts import INSPECT_KEY, header, need_tokens
from run_cache import RUN_TTL, run_at
from safe_display import dataframe, download_buttons, md, number
from sidebar import context
from token_reasons import block_reasons, sequence_reasons

from trustlens.analysis import tokens as tq
from trustlens.core.render import colored_tokens_html, legend_html
from trustlens.routing import flipped_tokens
from trustlens.run import blocked_column, column_doc

# Quantities a response can be coloured by, when the run holds them.
COLOUR_BY = (
    "ratio",
    "binary_tv",
    "binary_kl",
    "topk_tv",
    "topk_kl",
    "entropy",
    "advantage",
    "pi_logp",
    "mu_logp",
    "old_logp",
    "route_flips",
    "route_overlap",
)


@st.cache_data(ttl=RUN_TTL, max_entries=64, show_spinner=False)
def sample_updates(path: str, signature: tuple, sample: int, step: int) -> list[int]:
    return tq.updates_of_sample(run_at(path, signature).tokens, sample, step=step)


@st.cache_data(ttl=RUN_TTL, max_entries=64, show_spinner=False)
def one_sample(path: str, signature: tuple, sample: int, step: int, update: int | None):
    run = run_at(path, signature)
    return (
        tq.sample_tokens(run.tokens, sample, step=step, update=update),
        tq.sample_text(run.samples, sample, step=step),
    )


@st.cache_data(ttl=RUN_TTL, max_entries=32, show_spinner=False)
def driving_tokens(path: str, signature: tuple, alert: dict) -> pl.DataFrame:
    return tq.alert_tokens(run_at(path, signature).tokens, alert)


def address_target() -> dict:
    """A target from the address (?step=S&sample=N), so that a response can be linked to."""
    params = st.query_params
    if "sample" not in params or "step" not in params:
        return {}
    try:
        step, sample = int(params["step"]), int(params["sample"])
    except ValueError:
        st.warning("Ignoring the step and sample in the address: they must be integers.")
        return {}
    return {"reason": f"the address (step {step}, sample {sample})", "step": step, "sample": sample}


ctx = need_tokens(context())
header("Token inspector", ctx)

target = address_target() or st.session_state.get(INSPECT_KEY) or {}
query = target.get("query") or ctx.query
if target:
    st.info(f"Showing the tokens behind {md(target['reason'])}.")
    if st.button("Back to the sidebar filters", key="tl_clear_target", icon=":material/filter_alt:"):
        st.session_state.pop(INSPECT_KEY, None)
        st.query_params.clear()
        st.rerun()
    if target.get("alert"):
        with st.expander("The tokens this alert lists as its drivers", expanded=True):
            dataframe(driving_tokens(*ctx.key, target["alert"]), height=240)

# the rule whose blocked tokens lead: the filtered rule, else the run's active rule, else the first
focus = next(
    (r for r in (*(rule for rule, _ in query.decisions), ctx.run.active_rule, *ctx.rules) if r in ctx.rules),
    None,
)
summary = page_data.matching_samples(ctx, query)
if focus is not None and blocked_column(focus) in summary.columns:  # most blocked tokens first
    summary = summary.sort([blocked_column(focus), "rows"], descending=True, maintain_order=True)
picked = (target["step"], target["sample"]) if target.get("sample") is not None else None
if summary.is_empty() and picked is None:
    st.warning("No token matches these filters.")
    st.stop()

st.subheader("Samples with matching tokens")
st.caption(
    "Most tokens blocked by the focus rule (the sidebar's rule, else the run's) first, then most matching "
    "tokens (blocked_<rule>: how many of them the rule blocks). "
    "Pick one below to read it token by token."
)
dataframe(summary, height=220)

choices = list(dict.fromkeys(zip(summary["step"].to_list(), summary["sample"].to_list(), strict=True)))
if picked is not None and picked not in choices:
    choices.insert(0, picked)
step, sample = st.selectbox(
    "Sample",
    choices,
    index=choices.index(picked) if picked else 0,
    key="tl_sample",
    format_func=lambda c: f"step {c[0]} · sample {c[1]}",
)

names = ctx.table.collect_schema().names()
routed = bool(ctx.run.files.get("routing"))  # a mixture-of-experts run: its route columns hold values
quantities = [c for c in COLOUR_BY if c in names and (routed or not c.startswith("route_"))]
c1, c2 = st.columns(2)
quantity = c1.selectbox(
    "Colour by",
    quantities,
    key="tl_colour_by",
    help="Blue above the centre (1 for the ratio, 0 otherwise), red below; "
    "saturation relative to this response's largest deviation",
)
updates = sample_updates(*ctx.key, sample, step)
update = c2.selectbox("Update", updates, key="tl_update") if len(updates) > 1 else None
tokens, text = one_sample(*ctx.key, sample, step, update)
if tokens.is_empty():
    st.warning(f"Sample {sample} of step {step} has no token rows.")
    st.stop()

if text is not None:
    st.markdown(
        f"**Prompt** · reward {number(text.get('reward'))} · sequence advantage {number(text.get('advantage'))}"
    )
    st.text(text.get("prompt") or "")
length = text.get("length") if text is not None else None
count = f"{tokens.height} tokens" if length in (None, tokens.height) else f"{tokens.height} of its {length} tokens kept"
st.markdown(f"**Response** · {count}, coloured by {md(quantity)}: {md(column_doc(quantity))}")
rules = [r for r in ctx.rules if blocked_column(r) in tokens.columns]
st.html(legend_html(rules, quantity=quantity))
st.html(
    colored_tokens_html(
        tokens["token"].to_list(),
        tokens[quantity].to_list(),
        quantity=quantity,
        blocked={r: tokens[blocked_column(r)].to_list() for r in rules},
        hover={c: tokens[c].to_list() for c in quantities if c in tokens.columns and c != quantity},
        positions=tokens["pos"].to_list(),
    )
)
st.caption(
    "Hover a token for every recorded value; rings mark the rules that block it (a dashed ring and a number: "
    "that many rules, named on hover); ␣ is a space; … marks positions with no recorded row (a sampled run "
    "keeps every token that matters and a share of the rest)."
)
if routed and tokens["route_flips"].is_not_null().any():
    flipped = flipped_tokens(tokens)
    st.markdown(
        f"**Routing** · {flipped.height} of these tokens were routed to other experts by the trainer (π) than by "
        "the engine (μ) in at least one layer"
    )
    if not flipped.is_empty():
        st.caption("Per token its flipped layers, with the engine's and the trainer's expert sets there.")
        dataframe(flipped, height=min(240, 38 + 35 * flipped.height))
responses = sequence_reasons(tokens, ctx.run.rules)  # the rows of one response in one update
if not responses.is_empty():
    st.markdown("**The response as a whole** · the sequence rules decide every token of it from one ratio s")
    dataframe(responses, height=min(240, 38 + 35 * responses.height))
if focus is not None and blocked_column(focus) in tokens.columns:
    spec = ctx.run.rules.get(focus) or {}
    why = block_reasons(tokens, focus, spec, mu_recorded=ctx.anchor == "mu_logp")
    if why.is_empty():
        st.caption(f"{md(focus)} blocks none of these tokens.")
    else:
        st.markdown(f"**Why {md(focus)} blocks {why.height} of these tokens**")
        dataframe(why, height=min(240, 38 + 35 * why.height))
with st.expander("This sample's tokens as a table"):
    dataframe(tokens)
if target.get("query") is not None:
    st.subheader("Download the rows behind this view")
    download_buttons(
        tq.filter_tokens(ctx.table, query, anchor=ctx.anchor), f"{ctx.path.name}-inspected", key="tl_target_rows"
    )
