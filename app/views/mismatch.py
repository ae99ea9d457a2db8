"""Mismatch: how far the trainer's π_old is from the rollout engine's μ."""

import page_data
import polars as pl
import streamlit as st
from page_parts import chart, header, need_tokens
from run_cache import RUN_TTL, run_at
from safe_display import dataframe, md
from sidebar import Context, context
from tiles import NOISE, Tiles, decimal, noise_to_zero

from trustlens import plots
from trustlens.analysis import MISMATCH_COLUMNS, mismatch_trend
from trustlens.analysis.mismatch import NO_ROWS, SEQUENCE_LEVEL, with_logged_sequence_level


@st.cache_data(ttl=RUN_TTL, max_entries=32, show_spinner=False)
def logged_sequence_level(path: str, signature: tuple) -> pl.DataFrame:
    """The run's logged metric rows named as a sequence-level mismatch metric."""
    return run_at(path, signature).metrics.filter(pl.col("name").is_in(SEQUENCE_LEVEL)).collect()


def sources(ctx: Context, per_step: pl.DataFrame) -> str:
    """Which of the table's columns are exact, and where the sequence-level ones come from."""
    token_level = ", ".join(c for c in MISMATCH_COLUMNS if c not in SEQUENCE_LEVEL)
    sequence = ", ".join(SEQUENCE_LEVEL)
    filtered = not ctx.steps_only
    if not ctx.run.sampled and not filtered:
        return f"Every column is exact, from every token of the run ({sequence}: over whole responses)."
    if not ctx.run.sampled:
        return (
            f"Every column is over the tokens passing the sidebar's filters; {sequence} average each "
            "response over those tokens only."
        )
    if filtered:
        return (
            f"Under a token filter every column is estimated from the kept rows, and {sequence}, which "
            "need every token of a response, are empty."
        )
    empty = [c for c in SEQUENCE_LEVEL if per_step[c].is_null().all()]
    return (
        f"Exact, from the run's aggregates of all tokens: {token_level}. {sequence} average over whole "
        "responses, of which a sampled run keeps only some tokens: for a step that kept every token "
        "they are computed from its rows, else they are the value the run logged under the same name "
        "(the trainer's, which `trustlens export` sends too), else empty"
        + (f" (empty here: {', '.join(empty)}, not logged)." if empty else ".")
    )


ctx = need_tokens(context())
header("Mismatch", ctx)

reason, per_step, by_bucket = page_data.mismatch(ctx)
if reason == NO_ROWS:  # the run has token rows (need_tokens): the sidebar filters leave none
    st.warning("No token matches the sidebar filters.")
    st.stop()
if reason is not None or per_step is None or by_bucket is None:
    st.info(f"The training-inference mismatch cannot be measured here: {md(reason)}.")
    st.stop()
if ctx.exact:  # a sampled run's own exact values of the sequence-level metrics, where it logged them
    per_step = with_logged_sequence_level(per_step, logged_sequence_level(*ctx.key))

# k3_kl first: a KL estimate that is never negative (mismatch_kl, the K1 estimate, can be). A
# sampled run has log_ppl_abs_diff only where every token of a step was kept or the trainer
# logged it: without it the exact prob_diff_mean takes its tile.
SEQUENCE_TILE = "log_ppl_abs_diff" if per_step["log_ppl_abs_diff"].is_not_null().any() else "prob_diff_mean"
TILES = ("k3_kl", "mismatch_kl", SEQUENCE_TILE, "chi2_token", "prob_diff_max", "prob_pearson")
last = per_step.row(-1, named=True)
# the trend's first and last value of each tile (as the panel titles below write them)
ends = {r["metric"]: r for r in mismatch_trend(per_step, TILES).summary.iter_rows(named=True)}
# the estimators that can be negative, named as such on their tiles
SIGNED = {"mismatch_kl": "K1 estimate, can be < 0", "chi2_token": "χ² estimate, can be < 0"}
tiles = Tiles(len(TILES))
for name in TILES:
    scale = plots.scale_of(per_step[name])  # below NOISE of it: float rounding, shown as 0
    value = noise_to_zero(last.get(name), scale)
    first, final = (noise_to_zero(ends[name][k], scale) if name in ends else None for k in ("first", "last"))
    label = f"{name} ({SIGNED[name]})" if name in SIGNED else name
    tiles.add(
        label,
        decimal(value),
        exact=None if value is None else f"{value:.6g}",
        scope=f"step {last['step']}",
        delta=None if first is None or final is None else f"trend {decimal(first)} → {decimal(final)}",
        delta_color="off",
        delta_arrow="off",  # the trend's two ends say which way it went; an arrow on float noise misleads
        help=f"{MISMATCH_COLUMNS[name]}. Under the value: the trend line's first and last value (the chart "
        f"below); a value below {NOISE:g} of the column's scale (float rounding where μ = π_old) shows as 0.",
    )

chart(plots.mismatch_curves(per_step), "mm_curves", ctx=ctx)
metric = st.selectbox(
    "By μ bucket",
    ("k3_kl", "mismatch_kl", "chi2_token", "prob_diff_mean", "prob_diff_max", "prob_pearson"),
    key="mm_metric",
    help="Mismatch within each μ-probability bucket",
)
chart(plots.mismatch_by_bucket_bar(by_bucket, metric), "mm_bucket")
by_staleness = page_data.mismatch_staleness(ctx)
if not by_staleness.is_empty():  # the engine's weight versions were recorded (the `staleness` column)
    st.subheader("By staleness")
    st.caption(
        "Mismatch of the tokens by how many weight updates the engine's weights were behind π_old's when it "
        "sampled them (0: the same weights): what staleness adds on top of the engine's numerics. The doctor's "
        "level check judges the engine on the 0 row."
    )
    dataframe(by_staleness)
per_layer, by_flips, share = page_data.routing(ctx)
if share is not None:  # a mixture-of-experts run: the engine's and the trainer's experts were recorded
    st.subheader("By routing")
    st.caption(
        f"{share.flipped_share:.1%} of the tokens were routed to other experts by the trainer than by the engine "
        "in at least one layer. The map: per step and MoE layer, the share of tokens whose expert sets differ "
        "(exact, from every token). The table: k3 and |Δ log p| on the tokens with 0, 1 and 2+ flipped layers "
        "(update 0, weighted by the sampling weights of a sampled run), and the share of the run's k3 each carries."
    )
    chart(plots.routing_flips_heatmap(per_layer), "mm_routing")
    dataframe(by_flips, percent=["token_share", "k3_share", "dlogp_share"])
with st.expander("Per-step mismatch table"):
    st.caption(sources(ctx, per_step))
    dataframe(per_step)
    st.caption(" · ".join(f"{k}: {v}" for k, v in MISMATCH_COLUMNS.items()))
