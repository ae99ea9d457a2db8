"""Compare runs: several runs' per-step curves overlaid, and, for runs that share their settings
but differ in seed, the outcomes as mean ± standard error over seeds (trustlens.analysis.seeds)."""

import html
from pathlib import Path

import polars as pl
import streamlit as st
from page_parts import chart
from run_cache import RUN_TTL, run_at, run_label, run_signature, tokens_of
from run_queries import signals_and_alerts
from safe_display import dataframe, md
from sidebar import context
from view_state import multiselect_in_address

from trustlens import plots
from trustlens.analysis.collapse.logged import NO_TOKENS, metrics_only
from trustlens.analysis.collapse.timeline import run_timeline
from trustlens.analysis.seeds import OUTCOME_SCHEMA, OUTCOMES, run_outcome, seed_table, settings_key


@st.cache_data(ttl=RUN_TTL, max_entries=64, show_spinner=False)
def run_signals(path: str, signature: tuple):
    run = run_at(path, signature)
    if tokens_of(run) is None and not metrics_only(run):
        return None
    return signals_and_alerts(path, signature)[0]


@st.cache_data(ttl=RUN_TTL, max_entries=256, show_spinner=False)
def outcome(path: str, signature: tuple) -> dict | None:
    run = run_at(path, signature)
    return None if tokens_of(run) is None and not metrics_only(run) else run_outcome(run)


@st.cache_data(ttl=RUN_TTL, max_entries=64, show_spinner=False)
def story(path: str, signature: tuple) -> str:
    """One line: the run's first warning or critical alert and its collapse, from its timeline."""
    events = run_timeline(run_at(path, signature), signals_and_alerts(path, signature)[1])
    first = events.filter(pl.col("event") == "first signal").head(1).to_dicts()
    collapse = events.filter(pl.col("event") == "collapse").head(1).to_dicts()
    parts = [
        f"first signal at step {first[0]['step']} ({first[0]['kind']}, {first[0]['severity']})"
        if first
        else "no warning or critical alert",
        f"collapsed at step {collapse[0]['step']} ({collapse[0]['kind']})" if collapse else "no collapse",
    ]
    return " · ".join(parts)


def seed_groups(paths: list[str]) -> list[tuple[list[str], pl.DataFrame]]:
    """Groups of ≥ 2 runs with equal settings but different seeds, with their outcome rows."""
    groups: dict[str, list[str]] = {}
    seeds: dict[str, set] = {}
    for path in paths:
        run = run_at(path, run_signature(Path(path)))
        key = settings_key(run)
        groups.setdefault(key, []).append(path)
        seeds.setdefault(key, set()).add((run.manifest.get("config") or {}).get("seed"))
    out = []
    for key, members in groups.items():
        if len(seeds[key]) < 2:  # no outcomes (a scan of each run's tokens) without seeds to compare
            continue
        rows = [o for p in members if (o := outcome(p, run_signature(Path(p)))) is not None]
        if len({o["seed"] for o in rows}) >= 2:  # several seeds of at least one rule
            out.append((members, pl.DataFrame(rows, schema=OUTCOME_SCHEMA)))
    return out


def seed_bars(table: pl.DataFrame, stat: str):
    import plotly.graph_objects as go

    fig = go.Figure(
        go.Bar(
            x=[html.escape(str(r)) for r in table["rule"].to_list()],
            y=table[f"{stat}_mean"].to_list(),
            error_y=dict(type="data", array=table[f"{stat}_se"].fill_null(0.0).to_list()),
        )
    )
    fig.update_layout(title=f"{stat}: mean ± SE over seeds", height=320)
    if plots.is_rate(stat):
        fig.update_yaxes(tickformat=plots.RATE_FORMAT)
    return fig


ctx = context()
if ctx is None:
    st.stop()
st.title("Compare runs")
names = {str(p): run_label(ctx.root, p) for p in ctx.runs}
chosen = multiselect_in_address("Runs", names, key="cr_runs", param="compare", default=list(names)[:4])
frames, empty = {}, []
for path in chosen:
    signals = run_signals(path, run_signature(Path(path)))
    if signals is None:
        empty.append(names[path])
    else:
        frames[names[path]] = signals
if empty:
    st.info("No token rows yet in: " + ", ".join(md(n) for n in empty))
imported = [names[p] for p in chosen if metrics_only(run_at(p, run_signature(Path(p))))]
if imported:
    st.info(f"{', '.join(md(n) for n in imported)}: {NO_TOKENS}.")
if not frames:
    st.info("Pick runs with token rows to compare them.")
    st.stop()
columns = sorted({c for df in frames.values() for c in df.columns if c != "step"})
# learning (accuracy, reward), the tokens PPO's clip would block, and the mismatch
defaults = [c for c in ("accuracy", "reward", "blocked_ppo", "k3_kl") if c in columns] or columns[:1]
ys = st.multiselect("Signals", columns, default=defaults, key="cr_signals")
if ys:
    chart(plots.overlay_runs(frames, ys), "cr_overlay")
st.caption("Each run's first collapse signal and its collapse (Collapse signals has the whole timeline):")
for path in chosen:
    if names[path] in frames:
        st.markdown(f"**{md(names[path])}**: {md(story(path, run_signature(Path(path))))}")

groups = seed_groups(chosen)  # the picked runs only
if not groups:
    st.caption("Over seeds: pick runs that share their settings and differ in seed to see their outcomes.")
else:
    st.subheader("Over seeds")
    st.caption(
        "Runs with the same settings but different seeds, grouped by rule: mean ± standard error "
        "(sample sd / √n). Block rates are over A ≠ 0 tokens; collapse = accuracy below half its "
        "start, or the mean reward over 10% of the steps (≥ 5) below half the first window's; "
        "within_noise counts the runs whose final accuracy level (mean of the last 10% of the "
        "evaluations, ≥ 3) is below their best level by no more than 95% of runs whose accuracy "
        "never changes would be (binomial evaluations, simulated)."
    )
    for i, (members, outcomes) in enumerate(groups):
        try:
            table = seed_table(outcomes)
        except ValueError as err:  # two runs of one rule on one seed (e.g. a copied run folder)
            st.error(md(f"Settings group {i + 1} is not shown: {err}"))
            continue
        st.markdown(md(f"Settings group {i + 1}: {len(members)} runs, {table.height} rules"))
        dataframe(table, percent=plots.rate_columns(table))
        stat = st.selectbox("Outcome", OUTCOMES, index=1, key=f"cr_seed_stat_{i}")
        chart(seed_bars(table, stat), f"cr_seed_bars_{i}")
