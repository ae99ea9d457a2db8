"""The analysis results the pages show, cached per run version: queries on the chosen run's token
rows (per sidebar filters and arguments), its collapse signals and alerts, and the rules that can
be decided on its columns. No analysis happens here: queries are `trustlens.analysis` functions;
this module only caches their results."""

from __future__ import annotations

import importlib

import polars as pl
import streamlit as st
from run_cache import RUN_TTL, run_at
from sidebar import Context

from trustlens.analysis import tokens as tq
from trustlens.analysis.clipping import with_rules
from trustlens.analysis.collapse import detect_collapse
from trustlens.analysis.collapse.signals import step_signals
from trustlens.analysis.summary import exact_aggregates


@st.cache_data(ttl=RUN_TTL, max_entries=256, show_spinner=False)
def _on_tokens(
    name: str,
    path: str,
    signature: tuple,
    query: tq.TokenQuery | None,
    anchor: str,
    kwargs: tuple,
    decided: tuple[str, ...] = (),
    exact: bool = False,
):
    module, func = name.rsplit(".", 1)
    fn = getattr(importlib.import_module(module), func)
    run = run_at(path, signature)
    tokens = run.tokens
    if decided:
        tokens = with_rules(tokens, decided, base=run.rules)
    if query is not None:
        tokens = tq.filter_tokens(tokens, query, anchor=anchor)
    options = dict(kwargs)
    if exact:
        options["aggregates"] = exact_aggregates(run, None if query is None else query.steps)
    return fn(tokens, **options)


def on_tokens(fn, ctx: Context, *, filtered: bool = True, decided: tuple[str, ...] = (), exact: bool = False, **kwargs):
    """`fn(tokens, **kwargs)` for an analysis query `fn`, on the run's token rows (those passing
    the sidebar filters unless `filtered` is False), cached per run version, filters and kwargs.
    `decided`: rules the run did not record, decided on its columns first (analysis.with_rules).
    `exact`: `fn` takes `aggregates` (rule_confusion): a sampled run's exact aggregates are passed
    while the sidebar filters steps only and no rule is `decided` (they count recorded rules)."""
    query = ctx.query if filtered and ctx.query != tq.TokenQuery() else None
    name = f"{fn.__module__}.{fn.__qualname__}"
    exact = exact and filtered and ctx.exact and not decided
    return _on_tokens(name, *ctx.key, query, ctx.anchor, tuple(sorted(kwargs.items())), tuple(decided), exact)


def on_steps(fn, ctx: Context):
    """`fn(tokens, aggregates=...)` for a per-step analysis taking a sampled run's exact aggregates
    (step_summary, blocked_per_step, mismatch_per_step), on the filtered token rows: exact for all
    tokens while the sidebar filters steps only (`Context.exact`), else estimated from the kept
    rows. A run that recorded every token is exact either way."""
    query = ctx.query if ctx.query != tq.TokenQuery() else None
    name = f"{fn.__module__}.{fn.__qualname__}"
    return _on_tokens(name, *ctx.key, query, ctx.anchor, (), (), ctx.exact)


def decidable_rules(ctx: Context) -> list[str]:
    """Blocking rules of the registry the run did not record but whose inputs it holds: they can
    be decided on its columns (analysis.with_rules) and compared with the recorded ones. Batch
    rules are decided only when recorded (trustlens.rules.columns.not_redecidable)."""
    from trustlens.rules import RULES
    from trustlens.rules.columns import rule_columns

    names = set(ctx.tokens.collect_schema().names()) if ctx.tokens is not None else set()
    return [
        name
        for name, rule in RULES.items()
        if rule.blocks
        and rule.level != "batch"
        and name not in ctx.rules
        and set(rule_columns(rule, mu=ctx.anchor)) <= names
    ]


@st.cache_data(ttl=RUN_TTL, max_entries=32, show_spinner=False)
def signals_and_alerts(path: str, signature: tuple) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The run's per-step collapse signals and its alerts (on the whole run, unfiltered)."""
    run = run_at(path, signature)
    signals = step_signals(run)
    return signals, detect_collapse(run, signals=signals)
