"""The parts the dashboard's pages are built from: the page header, the stop for runs without
token rows, and the ways into the token inspector (the alert list, a chart's step control)."""

from __future__ import annotations

import math
from dataclasses import replace

import polars as pl
import streamlit as st
from safe_display import md, number
from sidebar import Context
from view_state import keep_valid, view_params

from trustlens import plots
from trustlens.analysis import tokens as tq
from trustlens.analysis.agreement import default_rule_pair
from trustlens.analysis.collapse import episode_span
from trustlens.analysis.collapse.logged import NO_TOKENS, metrics_only

# Session-state key of what the token inspector should open (see inspect_tokens).
INSPECT_KEY = "tl_inspect"
INSPECTOR = "views/token_inspector.py"
SEVERITY_ICONS = {"critical": ":material/error:", "warning": ":material/warning:", "info": ":material/info:"}


def header(title: str, ctx: Context) -> None:
    """The page title, the run's name and status, and the anchor note when μ is absent."""
    st.title(title)
    status = ctx.run.status
    st.caption(f"Run {md(ctx.path.name)} · status {md(status)} · {len(ctx.rules)} rules evaluated")
    config = ctx.run.manifest.get("config") or {}
    if isinstance(config, dict) and str(config.get("source", "")).startswith("trl."):
        per = (config.get("steps_per_generation") or 1) * (config.get("num_iterations") or 1)
        st.caption(
            f"A TRL run: a step here is one generation (one rollout batch), not one optimizer step; the "
            f"optimizer steps taken on it are its updates ({md(per)} micro-batch passes per generation: "
            "steps_per_generation × num_iterations)."
        )
    last = "no steps" if ctx.steps is None else f"{ctx.steps[1] + 1 - ctx.steps[0]} steps, up to step {ctx.steps[1]}"
    if status == "running" and ctx.stopped is not None:
        st.warning(
            f"This run is incomplete: it {md(ctx.stopped)}. The pages show what it wrote ({last}); "
            "a killed writer loses at most its last flush_seconds of rows."
        )
    elif status == "running":
        st.info("This run is still being written: the pages show its new steps as they arrive.")
    elif status not in ("finished", "None"):  # interrupted, failed (None: run.json holds no status)
        why = ctx.run.manifest.get("error") or ctx.run.manifest.get("signal")
        st.warning(
            f"This run is incomplete: it ended {md(status)}{f' ({md(why)})' if why else ''}. "
            f"The pages show what it wrote ({last})."
        )
    if ctx.anchor == "old_logp":
        st.info(
            "μ (the rollout policy) was not recorded in this run: the anchor is π_old, "
            "so ratios, divergences and buckets compare π with π_old."
        )
    if ctx.run.sampled:
        keep = ctx.run.manifest.get("keep") or {}
        numbers = (
            "The per-step numbers (token counts, block rates, A = 0 share, token-level mismatch) are exact, "
            "from the run's aggregates of all tokens; token-level views are drawn from the kept rows"
            if ctx.exact
            else "With a token filter in the sidebar, every number here is an estimate from the kept rows"
        )
        chosen = f" or by {md(', '.join(keep['rules']))}" if keep.get("rules") else ""
        st.info(
            f"Sampled run: the token rows are every token that matters (blocked by the active rule{chosen}, μ < "
            f"{number(keep.get('low_mu'))}, non-finite or top divergences) plus a {number(keep.get('rate'))} share "
            f"of the rest, each with its `weight`. {numbers}, where rates and counts weigh each row by its "
            "`weight` (docs/run-format.md)."
        )


def need_tokens(ctx: Context | None) -> Context:
    """Stop the page with a message unless there is a run with token rows (an imported run,
    which holds only metrics, says so: NO_TOKENS)."""
    ctx = need_steps(ctx, note=False)
    if metrics_only(ctx.run):
        st.info(f"This run was {NO_TOKENS}.")
        st.stop()
    return ctx


def need_steps(ctx: Context | None, *, note: bool = True) -> Context:
    """Stop the page with a message unless there is a run with steps: token rows, or the logged
    metrics of an imported run (said once, `note`: what needs its tokens is not shown)."""
    if ctx is None:
        st.stop()
    if ctx.steps is None:
        st.info("This run has no token rows yet.")
        st.stop()
    if note and metrics_only(ctx.run):
        st.info(f"This run was {NO_TOKENS}: the alerts come from its logged metrics, without driving tokens.")
    return ctx


def shown_rules(ctx: Context) -> list[str]:
    """The rules a block-rate chart draws (the others one legend click away): the run's active
    rule and the one compared with it, the sidebar's rule when one is picked, else the other of
    the PPO vs DPPO page's default pair."""
    active = ctx.run.active_rule if ctx.run.active_rule in ctx.rules else None
    picked = [rule for rule, _ in ctx.query.decisions if rule in ctx.rules]
    if picked or len(ctx.rules) < 2:
        return list(dict.fromkeys([r for r in (active, *picked) if r is not None])) or ctx.rules[:1]
    # with the active rule first, the default pair holds it (a ratio rule and a DPPO rule)
    ordered = [active, *(r for r in ctx.rules if r != active)] if active is not None else ctx.rules
    return list(default_rule_pair(ordered))


def inspect_tokens(**target) -> None:
    """Open the token inspector on `target`: the click-through used by alerts and charts.
    Keys: reason (shown), query (a TokenQuery replacing the sidebar's), and optionally step and
    sample (the response to show first) and alert (whose driving tokens are listed)."""
    st.session_state[INSPECT_KEY] = target
    st.switch_page(INSPECTOR, query_params=view_params())


def step_window(ctx: Context) -> tuple[int, float]:
    """The sidebar's step range for per-step signals: its last step extends past the token rows
    when the range reaches the run's last step, so the final held-out evaluation (logged after
    the last training step, with no token rows) stays in view."""
    lo, hi = ctx.shown_steps
    return lo, (math.inf if ctx.steps is not None and hi >= ctx.steps[1] else hi)


def in_steps(ctx: Context, frame: pl.DataFrame) -> pl.DataFrame:
    """The rows of per-step `frame` in the sidebar's step range (`step_window`); an alerts table
    (with end_step): the alerts that overlap it."""
    lo, hi = step_window(ctx)
    last = "end_step" if "end_step" in frame.columns else "step"
    return frame.filter((pl.col(last) >= lo) & (pl.col("step") <= hi))


def alert_list(ctx: Context, alerts: pl.DataFrame, *, limit: int = 20, key: str = "alerts") -> None:
    """The alerts within the sidebar's step range in time order (by first step), each with a
    button that opens the token inspector on the tokens and samples behind it."""
    shown = in_steps(ctx, alerts)
    if shown.is_empty():
        st.success("No collapse alerts in these steps.")
        return
    shown = shown.sort("step", "kind", maintain_order=True)
    for i, alert in enumerate(shown.head(limit).iter_rows(named=True)):
        alert_box(alert, f"{key}_{i}")
    if shown.height > limit:
        more = shown.height - limit
        st.caption(f"{more} more alert{'s' if more > 1 else ''}: see Collapse signals.")


def alert_box(alert: dict, key: str, *, lead: str = "", drivers: str = "") -> None:
    """One alert in a bordered box: `lead` (markdown, already escaped) before its severity, kind
    and message, `drivers` (escaped) under them, and the button that opens the token inspector
    on the tokens and samples behind it."""
    with st.container(border=True):
        left, right = st.columns([3, 1], vertical_alignment="center")
        icon = SEVERITY_ICONS.get(alert["severity"], "")
        left.markdown(f"{lead}{icon} **{md(alert['severity'])}** · {md(alert['kind'])} · {md(alert['message'])}")
        if "end_step" in alert:  # one episode: its severity over time
            left.caption(md(episode_span(alert)))
        if drivers:
            left.caption(drivers)
        if right.button("Inspect tokens", key=key, icon=":material/search:"):
            samples = alert["samples"] or []
            inspect_tokens(
                reason=f"alert: {alert['message']}",
                query=tq.alert_query(alert),
                alert=alert,
                step=alert["step"],
                sample=samples[0] if samples else None,
            )


def chart(fig, key: str, *, ctx: Context | None = None) -> None:
    """Show a plotly figure; with `ctx` (for charts whose x axis is the step), a control under it
    opens the token inspector on one step's filtered tokens.

    Not plotly's own click selection: Streamlit cannot select points of line traces, and on
    figures with subplots its selection events make the page rerun over and over
    (streamlit/streamlit#8766)."""
    st.plotly_chart(plots.plain_numbers(fig), key=key)
    if ctx is None:
        return
    lo, hi = ctx.shown_steps
    keep_valid(f"{key}_step", lambda v: lo <= v <= hi)
    with st.popover("Inspect the tokens of a step", icon=":material/search:"):
        step = st.number_input("Step", min_value=lo, max_value=hi, value=hi, key=f"{key}_step")
        if st.button("Open in the token inspector", key=f"{key}_inspect"):
            inspect_tokens(reason=f"step {step} of the chart", query=replace(ctx.query, steps=(step, step)))
