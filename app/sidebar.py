"""The dashboard's sidebar: the run picker and the shared filters, and the Context they hand to
the page being shown (through session state, see `context`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import polars as pl
import streamlit as st
from rule_groups import by_level, level_label
from run_cache import (
    Location,
    folder_exists,
    open_run,
    run_dirs,
    run_label,
    run_shape,
    run_signature,
    run_stopped,
    runs_root,
    tokens_of,
)
from safe_display import download_buttons, md
from view_state import keep_valid, remember, restore, steps_param

from trustlens.analysis import tokens as tq
from trustlens.analysis.buckets import bucket_table
from trustlens.run import MANIFEST, NoRowsError, Run

# Session-state key of the Context of the current script run.
CONTEXT_KEY = "tl_context"


@dataclass
class Context:
    """The run and the filters chosen in the sidebar, handed to the page being shown."""

    root: Location  # the folder the dashboard was started on (a local folder or an object-store URL)
    runs: list[Location]  # every run found under it
    path: Location  # the chosen run
    signature: tuple  # its on-disk signature (cache key)
    run: Run  # the chosen run, loaded
    tokens: pl.LazyFrame | None  # its token table (None: no token rows yet)
    rules: list[str]  # rules evaluated in the run
    anchor: str  # "mu_logp", or "old_logp" when μ was not recorded
    steps: tuple[int, int] | None  # the run's step range (None: no token rows yet)
    query: tq.TokenQuery = field(default_factory=tq.TokenQuery)  # the sidebar's filters
    stopped: str | None = None  # a run saying running that no writer writes: how it stopped (run_stopped)

    @property
    def table(self) -> pl.LazyFrame:
        """The token table, on pages that `need_tokens` (NoRowsError when there is none)."""
        return self.run.tokens

    @property
    def shown_steps(self) -> tuple[int, int]:
        """The steps the sidebar shows: its range, else the whole run (pages that `need_tokens`)."""
        steps = self.query.steps or self.steps
        if steps is None:
            raise NoRowsError(f"run {self.path.name} has no token rows yet")
        return steps

    @property
    def steps_only(self) -> bool:
        """Whether the sidebar filters steps only (no token filter: rule, bucket, sign, text)."""
        return replace(self.query, steps=None) == tq.TokenQuery()

    @property
    def exact(self) -> bool:
        """Whether per-step numbers of a sampled run come from its exact aggregates: the sidebar
        filters steps only (a token filter leaves only the kept rows to count)."""
        return self.run.sampled and self.steps_only

    @property
    def key(self) -> tuple[str, tuple]:
        """(path, signature): the first arguments of every cached query of this run."""
        return str(self.path), self.signature

    @property
    def anchor_name(self) -> str:
        return tq.ANCHOR_SYMBOLS[self.anchor]


def context() -> Context | None:
    """The Context the entry script built for this run of the page (None: nothing to show)."""
    return st.session_state.get(CONTEXT_KEY)


def sidebar() -> Context | None:
    """Draw the run picker and the shared filters; return the Context, or None after explaining
    on the page why there is nothing to show (no runs, unreadable run)."""
    root = runs_root()
    if root is None or not folder_exists(root):
        st.warning("No runs folder. Start the dashboard with `trustlens dashboard RUNS_DIR`.")
        return None
    runs = run_dirs(str(root))
    if not runs:
        st.info(f"No recorded runs in {md(root)} yet: a run is a folder holding {MANIFEST}.")
        return None
    sb = st.sidebar
    names = [run_label(root, p) for p in runs]
    restore("tl_run", st.query_params.get("run"), lambda v: v in names)
    name = sb.selectbox("Run", names, key="tl_run", on_change=remember, args=("tl_run",))
    remember("tl_run")
    st.query_params["run"] = name
    path = runs[names.index(name)]
    signature = run_signature(path)
    run, problems = open_run(str(path), signature)
    for problem in problems:
        st.warning(md(problem))
    tokens = tokens_of(run)
    rules = tq.rules_of(tokens) if tokens is not None else list(run.rules)
    anchor, steps = run_shape(str(path), signature)
    ctx = Context(
        root, runs, path, signature, run, tokens, rules, anchor, steps, stopped=run_stopped(path, run.manifest)
    )
    if sb.button("Reload runs", help="Read the runs folder again (new runs, new steps)"):
        st.cache_resource.clear()
        st.cache_data.clear()
        st.rerun()
    if steps is None:
        return ctx
    ctx.query = _filters(ctx)
    if tokens is None:  # an imported run (metrics only): steps to pick, no token rows to download
        return ctx
    with sb.expander("Download the filtered token rows"):
        download_buttons(tq.filter_tokens(ctx.table, ctx.query, anchor=anchor), f"{path.name}-tokens", "tl_rows")
    return ctx


def _follow_the_end(path: str, hi: int) -> None:
    """A run that grew (a live run's new steps): a chosen step range that reached its last step
    reaches the new last step, so the pages keep showing the whole run as it grows."""
    last = st.session_state.get("_tl_steps_end")  # (run, its last step) when the range was drawn
    if last is not None and last[0] == path and last[1] < hi:
        for key in ("tl_steps", "_tl_steps"):
            chosen = st.session_state.get(key)
            if chosen is not None and chosen[1] == last[1]:
                st.session_state[key] = (chosen[0], hi)
    st.session_state["_tl_steps_end"] = (path, hi)


def _filters(ctx: Context) -> tq.TokenQuery:
    """The shared filter widgets; their values persist across pages (keys in session state)."""
    sb = st.sidebar
    sb.subheader("Filters")
    lo, hi = ctx.shown_steps
    _follow_the_end(str(ctx.path), hi)
    restore("tl_steps", steps_param(st.query_params.get("steps")), lambda v: lo <= v[0] <= v[1] <= hi)
    keep_valid("tl_rule", lambda v: v is None or v in ctx.rules)
    if lo < hi:
        steps = sb.slider("Steps", lo, hi, (lo, hi), key="tl_steps", on_change=remember, args=("tl_steps",))
        remember("tl_steps")
        if steps == (lo, hi):
            st.query_params.pop("steps", None)
        else:
            st.query_params["steps"] = f"{steps[0]}-{steps[1]}"
    else:
        sb.caption(f"Step {lo} (the only step so far)")
        steps = (lo, hi)
    rule = sb.selectbox(
        "Rule",
        [None, *by_level(ctx.rules, ctx.run.rules)],
        format_func=lambda r: "any" if r is None else level_label(r, ctx.run.rules),
        key="tl_rule",
        help="Keep tokens by this rule's decision",
    )
    if rule is not None:
        blocked = sb.radio(
            "Decision",
            [True, False],
            horizontal=True,
            key="tl_blocked",
            format_func=lambda b: "blocked" if b else "not blocked",
        )
    buckets = {(r["p_lo"], r["p_hi"]): r["label"] for r in bucket_table().iter_rows(named=True)}
    bucket = sb.selectbox(
        f"{ctx.anchor_name} probability",
        [None, *buckets],
        key="tl_bucket",
        format_func=lambda b: "any" if b is None else buckets[b],
        help="Probability the anchor policy gave the sampled token (log-spaced buckets)",
    )
    sign = sb.selectbox(
        "Advantage", [None, *tq.ADVANTAGE_SIGNS], key="tl_sign", format_func=lambda s: "any sign" if s is None else s
    )
    text = sb.text_input(
        "Token text contains",
        key="tl_text",
        max_chars=200,
        help="Literal, case-insensitive search in the decoded token text",
    )
    decisions = ((rule, blocked),) if rule is not None else ()
    # the whole run is no step filter: queries then share their cache with unfiltered ones
    return tq.TokenQuery(
        steps=None if steps == (lo, hi) else steps,
        decisions=decisions,
        anchor_prob=bucket,
        advantage_sign=sign,  # type: ignore[arg-type]  # one of tq.ADVANTAGE_SIGNS or None
        text=text or None,
    )
