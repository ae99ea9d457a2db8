"""The queries behind each page, bundled: a page and the cache warmer ask for exactly the same
cached results, so that after the first page of a run has loaded, the others open from cache.

The warmer runs the default queries of every page in one background thread per run version and
filters, after the page being shown has finished (polars releases the GIL while it scans).
"""

from __future__ import annotations

import logging
import threading

import polars as pl
import streamlit as st
from run_cache import RUN_TTL, run_at
from run_queries import on_steps, on_tokens, signals_and_alerts
from sidebar import Context
from streamlit.runtime.scriptrunner import add_script_run_ctx

from trustlens.analysis import (
    blocked_by_bucket,
    blocked_by_token,
    blocked_per_step,
    confusion_matrix,
    figure1_density,
    mismatch_by_bucket,
    mismatch_by_staleness,
    mismatch_per_step,
    mismatch_unavailable,
    responses_blocked,
    rule_boundaries,
    rule_confusion,
    step_summary,
)
from trustlens.analysis import tokens as tq
from trustlens.analysis.agreement import default_rule_pair
from trustlens.analysis.seeds import accuracy_per_step
from trustlens.routing import flips_per_layer, mismatch_by_flips, routing_share

_LOG = logging.getLogger(__name__)
_warmed: set[tuple] = set()  # (path, signature, query) already warmed in this process
_warming = threading.Lock()  # held while a warmer runs: at most one at a time


@st.cache_data(ttl=RUN_TTL, max_entries=32, show_spinner=False)
def _accuracy(path: str, signature: tuple) -> list[tuple[int, float]]:
    return accuracy_per_step(run_at(path, signature))


@st.cache_data(ttl=RUN_TTL, max_entries=32, show_spinner=False)
def _samples_in_steps(path: str, signature: tuple, steps: tuple[int, int] | None) -> int | None:
    run = run_at(path, signature)
    if not run.files.get("samples"):
        return None
    rows = run.samples if steps is None else run.samples.filter(pl.col("step").is_between(*steps))
    return int(rows.select(pl.struct("step", "sample").n_unique()).collect().item())


def sample_count(ctx: Context) -> int | None:
    """How many responses the run generated in the sidebar's steps (its samples table: every
    sample, also those a sampled run kept no token row of), while the sidebar filters steps only;
    None under a token filter or without a samples table."""
    if not ctx.steps_only:
        return None
    return _samples_in_steps(*ctx.key, ctx.query.steps)


def overview(ctx: Context) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame, list]:
    """Per-step summary and blocked fractions (filtered), collapse signals and alerts, and the
    held-out accuracy of each evaluation, (step, accuracy) (whole run)."""
    return (
        on_steps(step_summary, ctx),
        on_steps(blocked_per_step, ctx),
        *signals_and_alerts(*ctx.key),
        _accuracy(*ctx.key),
    )


@st.cache_data(ttl=RUN_TTL, max_entries=32, show_spinner=False)
def _matching_samples(path: str, signature: tuple, query: tq.TokenQuery, anchor: str) -> pl.DataFrame:
    return tq.sample_summary(tq.filter_tokens(run_at(path, signature).tokens, query, anchor=anchor))


def matching_samples(ctx: Context, query: tq.TokenQuery) -> pl.DataFrame:
    """The samples with rows passing `query`, most matching rows first (token inspector)."""
    return _matching_samples(*ctx.key, query, ctx.anchor)


def ppo_vs_dppo(ctx: Context, rule_a: str, rule_b: str) -> dict[str, pl.DataFrame]:
    """Everything the PPO vs DPPO page draws for two rules on the filtered tokens; a rule the run
    did not record is decided on its columns first (`decided`)."""
    pair = (rule_a, rule_b)
    decided = tuple(r for r in pair if r not in ctx.rules)
    return {
        "total": on_tokens(
            rule_confusion, ctx, decided=decided, exact=True, rule_a=rule_a, rule_b=rule_b, per_step=False
        ),
        "per_step": on_tokens(rule_confusion, ctx, decided=decided, exact=True, rule_a=rule_a, rule_b=rule_b),
        "ratio_density": on_tokens(figure1_density, ctx, decided=decided, y="ratio", rules=pair),
        "tv_density": on_tokens(figure1_density, ctx, decided=decided, y="binary_tv", rules=pair),
        "boundaries": rule_boundaries({r: ctx.run.rules.get(r, {}) for r in pair}),
        "by_bucket": on_tokens(blocked_by_bucket, ctx, decided=decided, rules=pair),
        "matrix": on_tokens(confusion_matrix, ctx),
        "by_token": on_tokens(blocked_by_token, ctx, decided=decided, rules=pair, top=15),
        "responses": on_tokens(responses_blocked, ctx, decided=decided, rules=pair),
    }


def mismatch(ctx: Context) -> tuple[str | None, pl.DataFrame | None, pl.DataFrame | None]:
    """(why the mismatch cannot be measured, or None; per step; per μ bucket) on the filtered tokens."""
    reason = on_tokens(mismatch_unavailable, ctx)
    if reason is not None:
        return reason, None, None
    return None, on_steps(mismatch_per_step, ctx), on_tokens(mismatch_by_bucket, ctx)


def mismatch_staleness(ctx: Context) -> pl.DataFrame:
    """The mismatch per staleness of the filtered tokens (empty without the staleness column)."""
    return on_tokens(mismatch_by_staleness, ctx)


@st.cache_data(ttl=RUN_TTL, max_entries=32, show_spinner=False)
def _routing(path: str, signature: tuple):
    run = run_at(path, signature)
    if not run.files.get("routing"):  # a dense run: no routing table, no scan of its token rows
        return pl.DataFrame(), pl.DataFrame(), None
    return flips_per_layer(run), mismatch_by_flips(run), routing_share(run)


def routing(ctx: Context):
    """(flips per layer and step, mismatch by number of flipped layers, the RoutingShare) of a
    mixture-of-experts run, over the whole run; empty frames and None on a dense run."""
    return _routing(*ctx.key)


def _warm(ctx: Context) -> None:
    try:
        overview(ctx)
        matching_samples(ctx, ctx.query)
        mismatch(ctx)
        if len(ctx.rules) >= 2:
            ppo_vs_dppo(ctx, *default_rule_pair(ctx.rules))
    except Exception:  # only a warmer: the page that needs the result reports the error
        _LOG.debug("warming the dashboard caches failed", exc_info=True)
    finally:
        _warming.release()


def warm_up(ctx: Context | None) -> None:
    """Compute every page's default queries for this run and filters in the background, once."""
    if ctx is None or ctx.tokens is None or st.get_option("global.appTest"):
        return
    key = (*ctx.key, ctx.query)
    if key in _warmed or not _warming.acquire(blocking=False):
        return
    _warmed.add(key)
    thread = threading.Thread(target=_warm, args=(ctx,), name="trustlens-warm-up", daemon=True)
    add_script_run_ctx(thread)
    thread.start()
