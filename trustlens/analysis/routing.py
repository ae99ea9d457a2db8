"""Mismatch by routing (issue 49.4; public in trustlens.routing): how much of a mixture-of-experts
run's training–inference mismatch sits on the tokens the engine and the trainer routed differently.

The rows read are the token rows with routing (`route_flips` not null), log μ and the trainer's
log-probability π_old (log π at update 0 where π_old was not recorded: trustlens.analysis.mismatch
`trainer_logp`), at update 0: there π has π_old's weights, so the routing compared (π's, from the
forward that gave log π) is π_old's and a flip is the engine's, not the update's. Per token:
    Δ log p = log π_old − log μ (nats),  k3 = ρ − 1 − log ρ with log ρ = Δ log p,
each counted with its sampling weight w (1 in a run that recorded every token): counts, means and
shares are over the tokens the rows stand for.

Shares: `k3_share` = Σ_flipped w·k3 / Σ w·k3, the share of the run's k3 the tokens with a flip
carry. Since most tokens of a large MoE run flip somewhere, that share alone is not what routing
causes; `k3_excess_share` = (Σ_flipped w·k3 − n_flipped · k3̄_unflipped) / Σ w·k3 is the part
above what the flipped tokens would carry at the unflipped tokens' mean (null without unflipped
tokens), and the same for |Δ log p| (`dlogp_share`, `dlogp_excess_share`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from trustlens.analysis.buckets import collect, row_weight
from trustlens.analysis.mismatch import trainer_logp
from trustlens.analysis.sources import lazy_rows
from trustlens.run.reader import Run

FLIP_BUCKETS = ("0", "1", "2+")  # the tokens by their number of flipped layers


def routed_rows(source: Any) -> pl.LazyFrame:
    """The token rows of `source` (a Run or its token LazyFrame) with routing, μ and π_old at
    update 0, with `d` = Δ log p, `k3`, `w` (Float64) added; empty for a dense run."""
    tokens = lazy_rows("routed_rows", source)
    names = tokens.collect_schema().names()
    if "route_flips" not in names or "mu_logp" not in names:
        return tokens.head(0).select(*(pl.lit(None, pl.Float64).alias(c) for c in ("d", "k3", "w")))
    if "update" in names:
        tokens = tokens.filter(pl.col("update") == 0)
    for name, kind in (("old_logp", pl.Float32), ("weight", pl.Float32)):
        if name not in names:
            tokens = tokens.with_columns(pl.lit(None, kind).alias(name))
    d = trainer_logp() - pl.col("mu_logp").cast(pl.Float64)
    return (
        tokens.filter(pl.col("route_flips").is_not_null() & d.is_not_null())
        .with_columns(d.alias("d"), row_weight().alias("w"))
        .with_columns((pl.col("d").exp() - 1 - pl.col("d")).alias("k3"))
    )


def _summary(frame: pl.LazyFrame, by: pl.Expr | None) -> pl.LazyFrame:
    """tokens, k3_mean, dlogp_mean (mean |Δ log p|), k3_share, dlogp_share per group of `by`."""
    w = pl.col("w")
    aggs = [
        w.sum().alias("tokens"),
        (w * pl.col("k3")).sum().alias("_k3"),
        (w * pl.col("d").abs()).sum().alias("_d"),
    ]
    grouped = frame.select(aggs) if by is None else frame.group_by(by).agg(aggs)
    return grouped.with_columns(
        (pl.col("_k3") / pl.col("tokens")).alias("k3_mean"),
        (pl.col("_d") / pl.col("tokens")).alias("dlogp_mean"),
        (pl.col("_k3") / pl.col("_k3").sum()).alias("k3_share"),
        (pl.col("_d") / pl.col("_d").sum()).alias("dlogp_share"),
    ).drop("_k3", "_d")


def mismatch_by_flips(source: Any) -> pl.DataFrame:
    """Per number of flipped layers ("0", "1", "2+": `flipped`): tokens (Σ w), token_share,
    k3_mean, dlogp_mean (mean |Δ log p|, nats), k3_share and dlogp_share of the run's totals.
    Every bucket is listed (tokens 0 when empty); no rows on a dense run."""
    rows = routed_rows(source)
    flips = pl.col("route_flips")
    bucket = pl.when(flips == 0).then(pl.lit("0")).when(flips == 1).then(pl.lit("1")).otherwise(pl.lit("2+"))
    got = collect(_summary(rows, bucket.alias("flipped")))
    if got.is_empty():
        return got
    order = pl.DataFrame({"flipped": list(FLIP_BUCKETS)})
    out = order.join(got, on="flipped", how="left").with_columns(pl.col("tokens").fill_null(0.0))
    return out.with_columns((pl.col("tokens") / pl.col("tokens").sum()).alias("token_share")).select(
        "flipped", "tokens", "token_share", "k3_mean", "dlogp_mean", "k3_share", "dlogp_share"
    )


def mismatch_by_first_flip(source: Any) -> pl.DataFrame:
    """Per first flipped layer (`layer`, null: tokens without a flip), sorted by layer: tokens,
    k3_mean, dlogp_mean, k3_share, dlogp_share."""
    rows = routed_rows(source)
    out = collect(_summary(rows, pl.col("route_first_flip").alias("layer")))
    return out.sort("layer", nulls_last=True)


@dataclass(frozen=True)
class RoutingShare:
    """How much of the mismatch the tokens with a routing flip carry (module docstring)."""

    tokens: float  # tokens with routing (Σ w)
    flipped_share: float  # share of them with at least one flipped layer
    k3_share: float | None  # share of Σ k3 on the flipped tokens (None: no mismatch at all)
    k3_excess_share: float | None  # the part of it above the unflipped tokens' mean k3 (None: no unflipped tokens)
    dlogp_share: float | None  # share of Σ |Δ log p| on the flipped tokens
    dlogp_excess_share: float | None  # the part of it above the unflipped tokens' mean |Δ log p|
    k3_flipped: float | None  # mean k3 of the flipped tokens, nats
    k3_unflipped: float | None  # mean k3 of the tokens without a flip, nats


def routing_share(source: Any) -> RoutingShare | None:
    """The `RoutingShare` of a run's routed tokens; None for a dense run (no routing recorded)."""
    rows = routed_rows(source)
    flipped = pl.col("route_flips") > 0
    w, k3, d = pl.col("w"), pl.col("k3"), pl.col("d").abs()
    sums = collect(
        rows.select(
            w.sum().alias("n"),
            pl.when(flipped).then(w).sum().alias("n_flip"),
            (w * k3).sum().alias("k3"),
            pl.when(flipped).then(w * k3).sum().alias("k3_flip"),
            (w * d).sum().alias("d"),
            pl.when(flipped).then(w * d).sum().alias("d_flip"),
        )
    ).row(0, named=True)
    n, n_flip = sums["n"] or 0.0, sums["n_flip"] or 0.0
    if n == 0:
        return None

    def shares(total: float, on_flipped: float) -> tuple[float | None, float | None]:
        if not total > 0:
            return None, None
        if n_flip == n:
            return on_flipped / total, None
        baseline = (total - on_flipped) / (n - n_flip)  # the unflipped tokens' mean
        return on_flipped / total, (on_flipped - n_flip * baseline) / total

    k3_share, k3_excess = shares(sums["k3"], sums["k3_flip"])
    d_share, d_excess = shares(sums["d"], sums["d_flip"])
    return RoutingShare(
        tokens=n,
        flipped_share=n_flip / n,
        k3_share=k3_share,
        k3_excess_share=k3_excess,
        dlogp_share=d_share,
        dlogp_excess_share=d_excess,
        k3_flipped=sums["k3_flip"] / n_flip if n_flip else None,
        k3_unflipped=(sums["k3"] - sums["k3_flip"]) / (n - n_flip) if n > n_flip else None,
    )


# the shadow forward's per-step means (trustlens.train.routed.split_metrics), logged as metrics
SPLIT_METRICS = ("routing/abs_dlogp_routing", "routing/abs_dlogp_residual", "routing/k3_live", "routing/k3_replayed")


@dataclass(frozen=True)
class MeasuredSplit:
    """The shadow forward's split of Δ log p into routing (live − replayed) and residual
    (replayed − log μ), measured on the steps it ran (the built-in trainer's
    `--routing-split-every`, or a user logging `trustlens.routing.replay_split`'s means as the
    `routing/*` metrics): each step's means weighted by its response tokens at update 0 (Σ w)."""

    steps: int  # steps with the four split metrics
    tokens: float  # their response tokens (Σ w)
    dlogp_share: float | None  # Σ|routing| / (Σ|routing| + Σ|residual|) (None: no Δ log p at all)
    k3_share: float | None  # 1 − Σ k3 under μ's routing / Σ k3 under the trainer's own (None: no k3)


def measured_split(run: Run) -> MeasuredSplit | None:
    """The `MeasuredSplit` of a run's logged shadow forward; None when no step logged all four
    SPLIT_METRICS with tokens behind it."""
    if not isinstance(run, Run):
        raise TypeError(f"measured_split: run must be a Run (trustlens.load_run), got {type(run).__name__}")
    means = collect(
        run.metrics.filter(pl.col("name").is_in(SPLIT_METRICS))
        .group_by("step")
        .agg(*(pl.col("value").filter(pl.col("name") == n).mean().alias(n) for n in SPLIT_METRICS))
        .drop_nulls()
    )
    if means.is_empty():
        return None
    tokens = run.tokens.filter(pl.col("step").is_in(means["step"].to_list()))
    if "update" in tokens.collect_schema().names():
        tokens = tokens.filter(pl.col("update") == 0)
    counts = collect(tokens.group_by("step").agg(row_weight().sum().alias("n")))
    rows = means.join(counts, on="step")
    if rows.is_empty():
        return None
    n = rows["n"].cast(pl.Float64)
    routing, residual, k3_live, k3_replayed = (float((rows[name] * n).sum()) for name in SPLIT_METRICS)
    return MeasuredSplit(
        steps=rows.height,
        tokens=float(n.sum()),
        dlogp_share=routing / (routing + residual) if routing + residual > 0 else None,
        k3_share=1 - k3_replayed / k3_live if k3_live > 0 else None,
    )


def flips_per_layer(run: Run) -> pl.DataFrame:
    """Exact routing per (step, layer) from the run's `routing` table (all ranks and updates,
    every token, sampled run or not): tokens, flips, flip_rate (flips / tokens) and overlap_mean
    (mean |S_μ ∩ S_π| / k), sorted by step and layer; no rows for a dense run."""
    if not isinstance(run, Run):
        raise TypeError(f"flips_per_layer: run must be a Run (trustlens.load_run), got {type(run).__name__}")
    return collect(
        run.routing.group_by("step", "layer")
        .agg(pl.col("tokens").sum(), pl.col("flips").sum(), pl.col("overlap").sum())
        .with_columns(
            (pl.col("flips") / pl.col("tokens")).alias("flip_rate"),
            (pl.col("overlap") / pl.col("tokens")).alias("overlap_mean"),
        )
        .drop("overlap")
        .sort("step", "layer")
    )


def flipped_layers(run: Run, top: int = 3) -> list[dict[str, Any]]:
    """The `top` layers with the highest flip rate over the whole run (exact, from the routing
    table): [{layer, tokens, flips, flip_rate}], highest first."""
    per_layer = flips_per_layer(run)
    if per_layer.is_empty():
        return []
    layers = (
        per_layer.group_by("layer")
        .agg(pl.col("tokens").sum(), pl.col("flips").sum())
        .with_columns((pl.col("flips") / pl.col("tokens")).alias("flip_rate"))
        .sort(["flip_rate", "layer"], descending=[True, False])
        .head(top)
    )
    return layers.to_dicts()


def flipped_tokens(tokens: pl.DataFrame) -> pl.DataFrame:
    """The tokens of `tokens` (rows of one response, with the route columns) that flipped
    somewhere: pos, token (untrusted text), route_flips, route_overlap and `experts`, per flipped
    layer "layer: μ [ids] → π [ids]"; no rows without routing or flips."""
    if "route_layers" not in tokens.columns:
        return pl.DataFrame()
    rows = tokens.filter(pl.col("route_flips") > 0)
    text = []
    for layers, mu, pi in rows.select("route_layers", "route_mu_experts", "route_pi_experts").iter_rows():
        k = len(mu) // len(layers)
        text.append(
            "; ".join(
                f"{layer}: μ {mu[i * k : (i + 1) * k]} → π {pi[i * k : (i + 1) * k]}" for i, layer in enumerate(layers)
            )
        )
    token = pl.col("token").cast(pl.String) if "token" in rows.columns else pl.lit(None, pl.String)
    return rows.select("pos", token.alias("token"), "route_flips", "route_overlap").with_columns(
        pl.Series("experts", text, pl.String)
    )
