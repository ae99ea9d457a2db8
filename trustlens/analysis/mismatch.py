"""Training-inference mismatch: how far the trainer's π_old is from the rollout engine's μ on the
tokens μ sampled (polars, lazy in, small DataFrame out).

With ρ = π_old(a_t)/μ(a_t) per token, the per-step quantities, named as in `trustlens.metrics`
(which gives verl's name for each):

    mismatch_kl       mean(log μ − log π_old)               K1 estimate of KL(μ ‖ π_old), nats
    k3_kl             mean(ρ − 1 − log ρ)                   K3 estimate of KL(μ ‖ π_old), ≥ 0, nats
    log_ppl_diff      mean over sequences of mean_t(log μ − log π_old)
                      = log PPL_trainer − log PPL_rollout, nats
    log_ppl_abs_diff  the same with |·| per sequence
    chi2_token        mean(ρ²) − 1                          token-level χ²(π_old ‖ μ)
    chi2_seq          mean over sequences of (Π_t ρ_t)² − 1
    prob_diff_mean,   mean / max of |π_old(a_t) − μ(a_t)|, probability
    prob_diff_max
    prob_pearson      Pearson correlation of the probabilities μ(a_t) and π_old(a_t)

Clamping, as verl's `compute_offpolicy_metrics` does: only the χ² terms clamp, log ρ (chi2_token)
and Σ_t log ρ_t (chi2_seq) to ±20 before exponentiating. mismatch_kl, k3_kl and the log-PPL
differences use log ρ as it is, so a token π_old gives probability 0 makes them +inf (a value,
docs/rules.md), as in verl. The one difference from verl: verl's k3_kl exponentiates log ρ in the
training dtype (float32 overflows to inf above log ρ ≈ 88); here every term is float64.

Sequences are (step, update, sample). π_old is `old_logp`; where a run did not record it, the
policy's log-probability at the first update of the step (`pi_logp` of rows with update 0,
computed before any optimizer step, hence equal to π_old) stands in.

A sampled run (recorded with `Keep`): the token-level statistics are exact from its aggregates
(`aggregates=`). The sequence-level ones (SEQUENCE_LEVEL: log_ppl_diff, log_ppl_abs_diff,
chi2_seq) need every token of a response, and no weighting of the kept rows gives them: a
response's mean over its kept tokens is dominated by the tokens kept because they matter (on the
shipped sample, log_ppl_diff over kept rows was ~8× the trainer's). They are therefore computed
from the rows only for steps that kept every token (rows without weights, or as many rows as the
aggregates count tokens: `Keep(rate=1)`), and are null otherwise; `with_logged_sequence_level`
fills them with the values the run logged under the same names (`logged_per_step`, which
`trustlens export` sends too), so that one name never carries two numbers.

A run without μ (an external trainer) has no mismatch to measure: every function then returns an
empty frame with its usual columns, and `mismatch_unavailable` says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from trustlens.analysis.buckets import (
    MIN_P,
    PER_DECADE,
    bucket_expr,
    bucket_table,
    collect,
    row_weight,
    weighted,
    weighted_mean,
)
from trustlens.analysis.sources import RunOrTokens, lazy_rows, token_rows
from trustlens.core.argument_checks import check_columns, check_int, check_names, check_type
from trustlens.metrics import MISMATCH_METRICS, describe
from trustlens.run.aggregates import mismatch_stats, step_aggregates

# log ρ (chi2_token) and Σ_t log ρ_t (chi2_seq) are clamped to ±this before exponentiating
# (verl's SAFETY_BOUND); no other statistic is clamped.
LOG_RATIO_BOUND = 20.0

# The per-step columns and their meaning (tooltips, docs), from the metric registry.
MISMATCH_COLUMNS: dict[str, str] = {
    "tokens": "tokens with both μ and π_old",
    **{name: describe(name) for name in MISMATCH_METRICS},
}
_TOKEN_LEVEL = ("mismatch_kl", "k3_kl", "chi2_token", "prob_diff_mean", "prob_diff_max", "prob_pearson")
# The per-step metrics that average over sequences: exact only from every token of a response.
SEQUENCE_LEVEL = ("log_ppl_diff", "log_ppl_abs_diff", "chi2_seq")


def trainer_logp() -> pl.Expr:
    """log π_old(a_t) per row (Float64): old_logp, else pi_logp on rows of the step's first
    update (the same policy: no optimizer step has run yet)."""
    return pl.coalesce(pl.col("old_logp"), pl.when(pl.col("update") == 0).then(pl.col("pi_logp"))).cast(pl.Float64)


def _k3(log_rho: pl.Expr) -> pl.Expr:
    """The K3 term ρ − 1 − log ρ of a token, from log ρ = log π_old − log μ (nats)."""
    return log_rho.exp() - 1 - log_rho


def _prob_diff(old: pl.Expr, mu: pl.Expr) -> pl.Expr:
    """|π_old(a_t) − μ(a_t)| of a token, from the probabilities (not their logs)."""
    return (old - mu).abs()


def token_mismatch(*, weights: bool) -> list[pl.Expr]:
    """k3_kl and prob_diff_mean as aggregations of token rows (e.g. in a `group_by("step")`):
    means over the rows with μ and π_old, each counting its sampling weight with `weights`. The
    values `mismatch_per_step` gives from the rows (up to float64 rounding: the sums are taken in
    another order), in one pass with other aggregations of the same rows (`step_signals`)."""
    mu, old = pl.col("mu_logp").cast(pl.Float64), trainer_logp()
    pair = mu.is_not_null() & old.is_not_null()
    return [
        weighted_mean(_k3(old - mu), pair, weights=weights).alias("k3_kl"),
        weighted_mean(_prob_diff(old.exp(), mu.exp()), pair, weights=weights).alias("prob_diff_mean"),
    ]


def _pairs(tokens: pl.LazyFrame) -> pl.LazyFrame:
    """Rows with both μ and π_old, with their sampling weight `w` (1 in a full run), whether the
    row is one of a sample (`kept`: it has a weight) and the per-token terms every statistic
    sums."""
    log_rho = pl.col("old") - pl.col("mu")
    lr = log_rho.clip(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    has_weights = weighted(tokens)
    extra = ["staleness"] if "staleness" in tokens.collect_schema().names() else []
    return (
        tokens.select(
            "step",
            "update",
            "sample",
            *extra,
            pl.col("mu_logp").cast(pl.Float64).alias("mu"),
            trainer_logp().alias("old"),
            (row_weight() if has_weights else pl.lit(1.0, pl.Float64)).alias("w"),
            (pl.col("weight").is_not_null() if has_weights else pl.lit(False)).alias("kept"),
        )
        .filter(pl.col("mu").is_not_null() & pl.col("old").is_not_null())
        .with_columns(
            log_rho.alias("log_rho"),
            lr.exp().alias("rho_safe"),
            pl.col("mu").exp().alias("x"),
            pl.col("old").exp().alias("y"),
        )
    )


# Weighted sums that every statistic is a function of (weights: 1 in a full run, the sampling
# weights in a sampled one); summing them per sequence first and then per step (or bucket) reads
# the table once.
_W = pl.col("w")
_SUMS = {
    "n": _W.sum(),
    "s_k1": (-pl.col("log_rho") * _W).sum(),
    "s_k3": (_k3(pl.col("log_rho")) * _W).sum(),
    "s_rho2": (pl.col("rho_safe") * pl.col("rho_safe") * _W).sum(),
    "s_dp": (_prob_diff(pl.col("y"), pl.col("x")) * _W).sum(),
    "m_dp": _prob_diff(pl.col("y"), pl.col("x")).max(),
    "s_x": (pl.col("x") * _W).sum(),
    "s_y": (pl.col("y") * _W).sum(),
    "s_xx": (pl.col("x") * pl.col("x") * _W).sum(),
    "s_yy": (pl.col("y") * pl.col("y") * _W).sum(),
    "s_xy": (pl.col("x") * pl.col("y") * _W).sum(),
}


def _sums() -> list[pl.Expr]:
    return [e.alias(k) for k, e in _SUMS.items()]


def _token_stats() -> list[pl.Expr]:
    """The token-level statistics from group sums of `_sums` (columns n, s_*, m_dp)."""
    n = pl.col("n").sum()
    mean = {k: pl.col(k).sum() / n for k in ("s_k1", "s_k3", "s_rho2", "s_dp", "s_x", "s_y", "s_xx", "s_yy", "s_xy")}
    cov = mean["s_xy"] - mean["s_x"] * mean["s_y"]
    var_x = mean["s_xx"] - mean["s_x"] * mean["s_x"]
    var_y = mean["s_yy"] - mean["s_y"] * mean["s_y"]
    pearson = pl.when((n > 1) & (var_x > 0) & (var_y > 0)).then(cov / (var_x * var_y).sqrt())
    return [
        n.round().cast(pl.Int64).alias("tokens"),
        mean["s_k1"].alias("mismatch_kl"),
        mean["s_k3"].alias("k3_kl"),
        (mean["s_rho2"] - 1).alias("chi2_token"),
        mean["s_dp"].alias("prob_diff_mean"),
        pl.col("m_dp").max().alias("prob_diff_max"),
        pearson.clip(-1.0, 1.0).alias("prob_pearson"),
    ]


def _schema(keys: dict[str, pl.DataType], columns: tuple[str, ...]) -> dict[str, pl.DataType]:
    return {**keys, "tokens": pl.Int64(), **{c: pl.Float64() for c in columns}}


NO_ROWS = "the run has no token rows yet"


def mismatch_unavailable(tokens: RunOrTokens) -> str | None:
    """Why the mismatch of this token table cannot be measured, or None when it can. An empty
    table gives NO_ROWS, which a caller that filtered the table words as its filters matching
    nothing."""
    tokens = lazy_rows("mismatch_unavailable", tokens)
    names = tokens.collect_schema().names()
    if "mu_logp" not in names:
        return "the token table has no mu_logp column: μ (the rollout engine's log-probabilities) was not recorded"
    row = collect(
        tokens.select(
            pl.len().alias("rows"),
            pl.col("mu_logp").is_not_null().sum().alias("mu"),
            (pl.col("mu_logp").is_not_null() & trainer_logp().is_not_null()).sum().alias("both"),
        )
    ).row(0, named=True)
    if row["rows"] == 0:
        return NO_ROWS
    if row["mu"] == 0:
        return (
            "μ (mu_logp) is null in every row: the run was recorded without the rollout "
            "engine's log-probabilities, so the training-inference mismatch cannot be measured"
        )
    if row["both"] == 0:
        return (
            "no row has both μ and π_old: old_logp was not recorded and no row of a step's first update holds pi_logp"
        )
    return None


def mismatch_per_step(tokens: RunOrTokens, *, aggregates: pl.LazyFrame | None = None) -> pl.DataFrame:
    """Per step: step, tokens and the `trustlens.metrics.MISMATCH_METRICS` (mismatch_kl, k3_kl,
    log_ppl_diff, log_ppl_abs_diff, chi2_token, chi2_seq, prob_diff_mean, prob_diff_max,
    prob_pearson; see the module docstring); sorted by step, only steps with both μ and π_old.
    Empty (same columns) when `mismatch_unavailable` gives a reason.

    A sampled run's rows count with their sampling weights (estimates). aggregates: the exact
    aggregates of all tokens (`Run.aggregates`, limited to the same steps): tokens and the
    token-level metrics of steps whose aggregates hold μ–π_old pairs come from them. The
    sequence-level metrics (SEQUENCE_LEVEL) of a step with sampled rows are null unless the
    aggregates show that its rows are all of its tokens (module docstring;
    `with_logged_sequence_level` fills them from the run's logged metrics)."""
    tokens, aggregates = token_rows("mismatch_per_step", tokens, aggregates)
    out_cols = MISMATCH_METRICS
    schema = _schema({"step": pl.Int32()}, out_cols)
    if "mu_logp" not in tokens.collect_schema().names():
        return pl.DataFrame(schema=schema)
    lpd = pl.col("s_k1") / pl.col("n")  # per sequence: mean(log μ − log π_old)
    log_rho_seq = (-pl.col("s_k1")).clip(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    df = collect(
        _pairs(tokens)
        .group_by("step", "update", "sample")
        .agg(*_sums(), pl.col("kept").any())
        .group_by("step")
        .agg(
            *_token_stats(),
            lpd.mean().alias("log_ppl_diff"),
            lpd.abs().mean().alias("log_ppl_abs_diff"),
            ((2 * log_rho_seq).exp() - 1).mean().alias("chi2_seq"),
            pl.col("kept").any(),
        )
        .sort("step")
    )
    totals = None if aggregates is None else step_aggregates(aggregates)
    whole = ~pl.col("kept")  # steps whose rows are every token: no row is one of a sample
    if totals is not None and df["kept"].any():
        whole = whole | pl.col("step").is_in(_fully_kept(tokens, totals).implode())
    df = df.select(
        pl.col("step").cast(pl.Int32),
        pl.col("tokens").cast(pl.Int64),
        *(pl.when(whole).then(pl.col(c)).alias(c) if c in SEQUENCE_LEVEL else pl.col(c) for c in out_cols),
    ).with_columns(pl.col(c).cast(pl.Float64) for c in out_cols)
    if totals is None:
        return df
    steps = totals.filter(pl.col("pairs") > 0)
    exact = mismatch_stats(steps).select(
        pl.col("step").cast(pl.Int32), *(pl.col(c).cast(pl.Float64) for c in _TOKEN_LEVEL)
    )
    exact = exact.with_columns(steps["pairs"].cast(pl.Int64).alias("tokens"))
    return df.update(exact, on="step", how="left")


def _fully_kept(tokens: pl.LazyFrame, totals: pl.DataFrame) -> pl.Series:
    """The steps of a sampled run whose token rows are all of their tokens: as many rows as its
    aggregates (`totals`, per step) count tokens (every token kept, e.g. with `Keep(rate=1)`)."""
    rows = collect(tokens.group_by("step").agg(pl.len().alias("rows")))
    counted = totals.select(pl.col("step").cast(rows["step"].dtype), "tokens")
    return rows.join(counted, on="step").filter(pl.col("rows") == pl.col("tokens"))["step"]


def logged_per_step(metrics: pl.LazyFrame, names: Sequence[str] | None = None) -> pl.DataFrame:
    """The metrics a run logged (`Run.metrics`: step, rank, name, value), one value per step and
    name: step, name, value (Float64), the mean over the ranks that logged it, sorted by step and
    name; only `names` when given. What `trustlens export` sends under a logged name, and what
    `with_logged_sequence_level` shows, so that the two cannot differ."""
    if names is not None:
        metrics = metrics.filter(pl.col("name").is_in(list(names)))
    return collect(metrics.group_by("step", "name").agg(pl.col("value").cast(pl.Float64).mean()).sort("step", "name"))


def with_logged_sequence_level(per_step: pl.DataFrame, metrics: pl.LazyFrame | pl.DataFrame) -> pl.DataFrame:
    """`per_step` (a `mismatch_per_step` frame of a sampled run's unfiltered token rows, with its
    aggregates) with each null sequence-level value (SEQUENCE_LEVEL: a step that kept only some
    of its tokens) taken from the run's logged metrics of the same name at that step
    (`logged_per_step`: the trainer's exact value, e.g. the built-in trainer's log_ppl_diff);
    null where the run logged none. Values computed from every token of a step stay."""
    logged = logged_per_step(metrics.lazy(), SEQUENCE_LEVEL)
    wide = logged.group_by("step").agg(
        pl.col("value").filter(pl.col("name") == c).first().alias(f"logged_{c}") for c in SEQUENCE_LEVEL
    )
    joined = per_step.join(wide.with_columns(pl.col("step").cast(pl.Int32)), on="step", how="left")
    return joined.with_columns(pl.coalesce(c, f"logged_{c}").alias(c) for c in SEQUENCE_LEVEL).select(per_step.columns)


def mismatch_by_bucket(tokens: RunOrTokens, *, min_p: float = MIN_P, per_decade: int = PER_DECADE) -> pl.DataFrame:
    """Per μ-probability bucket: bucket, p_lo, p_hi, label, tokens, mismatch_kl, k3_kl,
    chi2_token, prob_diff_mean, prob_diff_max, prob_pearson; every bucket listed (tokens 0 and nulls where empty).
    Empty when `mismatch_unavailable` gives a reason."""
    tokens = lazy_rows("mismatch_by_bucket", tokens)
    buckets = bucket_table(min_p, per_decade)
    schema = {**buckets.schema, **_schema({}, _TOKEN_LEVEL)}
    if "mu_logp" not in tokens.collect_schema().names():
        return pl.DataFrame(schema=schema)
    df = collect(
        _pairs(tokens)
        .group_by(bucket_expr("mu", min_p, per_decade).alias("bucket"))
        .agg(_sums())
        .group_by("bucket")
        .agg(_token_stats())
    )
    if df.is_empty():
        return pl.DataFrame(schema=schema)
    out = buckets.join(df, on="bucket", how="left", maintain_order="left")
    out = out.with_columns(pl.col("tokens").fill_null(0))
    return out.select(
        *buckets.columns, pl.col("tokens").cast(pl.Int64), *(pl.col(c).cast(pl.Float64) for c in _TOKEN_LEVEL)
    ).sort("bucket")


def mismatch_by_staleness(tokens: RunOrTokens) -> pl.DataFrame:
    """Per staleness (the per-token `staleness` column: weight updates between the weights that
    sampled the token and π_old's): staleness, tokens, and the token-level statistics of
    `mismatch_by_bucket`, fresh tokens (0) first. Empty when the run has no staleness recorded
    or no μ–π_old pairs: the mismatch a stale engine adds on top of its numerics, by how stale."""
    tokens = lazy_rows("mismatch_by_staleness", tokens)
    schema = _schema({"staleness": pl.Float64()}, _TOKEN_LEVEL)
    names = tokens.collect_schema().names()
    if "mu_logp" not in names or "staleness" not in names:
        return pl.DataFrame(schema=schema)
    df = collect(
        _pairs(tokens.filter(pl.col("staleness").is_not_null()))
        .group_by(pl.col("staleness").cast(pl.Float64))
        .agg(_sums())
        .group_by("staleness")
        .agg(_token_stats())
        .sort("staleness")
    )
    if df.is_empty():
        return pl.DataFrame(schema=schema)
    return df.select("staleness", pl.col("tokens").cast(pl.Int64), *(pl.col(c).cast(pl.Float64) for c in _TOKEN_LEVEL))


@dataclass(frozen=True)
class MismatchTrend:
    """How the mismatch moved over a run (`mismatch_trend`)."""

    window: int  # steps in the centred rolling mean
    smoothed: pl.DataFrame  # step and each metric's rolling mean, one row per step
    summary: pl.DataFrame  # metric, first, last (of the rolling mean), change = last − first


def mismatch_trend(per_step: pl.DataFrame, metrics: Sequence[str], *, window: int | None = None) -> MismatchTrend:
    """The trend of each of `metrics` in a `mismatch_per_step` frame: a centred rolling mean over
    `window` steps (default: a tenth of the steps, at least 3, odd) ignoring nulls and non-finite
    values, and its change from the first to the last step (null with fewer than two steps)."""
    check_type("per_step", per_step, pl.DataFrame, "a polars DataFrame (mismatch_per_step's table)")
    metrics = check_names("metrics", metrics)
    check_columns("per_step", per_step.columns, ["step", *metrics])
    window = max(3, per_step.height // 10) | 1 if window is None else check_int("window", window, low=1)
    finite = [pl.when(pl.col(m).is_finite()).then(pl.col(m)).alias(m) for m in metrics]
    smoothed = (
        per_step.sort("step")
        .select("step", *finite)
        .with_columns(pl.col(m).rolling_mean(window, min_samples=1, center=True) for m in metrics)
    )
    rows = []
    for m in metrics:
        values = smoothed[m].drop_nulls()
        first, last = (values[0], values[-1]) if values.len() >= 2 else (None, None)
        rows.append({"metric": m, "first": first, "last": last, "change": None if first is None else last - first})
    schema = {"metric": pl.String, "first": pl.Float64, "last": pl.Float64, "change": pl.Float64}
    return MismatchTrend(window, smoothed, pl.DataFrame(rows, schema=schema))


__all__ = [
    "LOG_RATIO_BOUND",
    "MISMATCH_COLUMNS",
    "NO_ROWS",
    "SEQUENCE_LEVEL",
    "MismatchTrend",
    "logged_per_step",
    "mismatch_by_bucket",
    "mismatch_per_step",
    "mismatch_trend",
    "mismatch_unavailable",
    "token_mismatch",
    "trainer_logp",
    "with_logged_sequence_level",
]
