"""Which tokens each trust-region rule blocks (polars, lazy in, small DataFrame out).

Every function takes a run's token table (`Run.tokens`, a LazyFrame) and returns a small
DataFrame. Counts per rule only include rows where the rule was evaluated (a null
`blocked_<rule>` — e.g. a top-K rule without top-K data — is not counted) and whose advantage is
not 0: a token with A = 0 carries no gradient and no rule blocks it (docs/rules.md), so `blocked_frac`
= blocked / count is the fraction of evaluated A ≠ 0 tokens the rule blocks. The A = 0 share is
reported on its own (`zero_advantage_per_step`, the summary's `zero_adv_frac`).

The anchor probability on the x axis of the bucketed and Figure-1 queries is μ(a_t), or π_old(a_t)
in a run without μ (see `trustlens.analysis.tokens.anchor_column`).

Long-format results have the columns
    keys…, rule, count, blocked, blocked_frac
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl

from trustlens.analysis.buckets import (
    LN10,
    MIN_P,
    PER_DECADE,
    anchor_column,
    blocked_aggs,
    bucket_expr,
    bucket_table,
    checked_rules,
    collect,
    long_by_rule,
    nonzero_advantage,
    token_counter,
    weighted,
)
from trustlens.analysis.sources import RunOrTokens, check_rule_entries, lazy_rows, token_rows
from trustlens.analysis.tokens import ADVANTAGE_SIGNS
from trustlens.core.argument_checks import check_choice, check_fraction, check_int, check_interval, check_names
from trustlens.run import blocked_column
from trustlens.run.aggregates import step_aggregates
from trustlens.run.reader import Run

Rules = str | Sequence[str] | None


def with_rules(tokens: RunOrTokens, rules: Sequence[str], *, base: Mapping[str, Mapping] | None = None) -> pl.LazyFrame:
    """`tokens` with a `blocked_<rule>` column for each of `rules` the table lacks, decided on the
    recorded columns by `trustlens.rules.columns.evaluate_columns` (no torch): a rule the run did not
    evaluate, compared counterfactually. `base` ({rule: manifest entry}, `Run.rules`) gives
    thresholds and brings back custom rules; the anchor is μ, or π_old in a run without μ.
    ValueError naming the rule when the table lacks a column it reads."""
    if base is None and isinstance(tokens, Run):
        base = tokens.rules
    elif base is not None:
        check_rule_entries("base", base)
    tokens = lazy_rows("with_rules", tokens)
    rules = check_names("rules", rules)
    from trustlens.rules import Rule, get_rule, rule_from_manifest
    from trustlens.rules.columns import check_rule_columns, evaluate_columns

    names = tokens.collect_schema().names()
    mu = anchor_column(tokens)
    added = []
    for name in rules:
        if blocked_column(name) in names:
            continue
        given = (base or {}).get(name)
        rule = rule_from_manifest(name, given) if isinstance(given, Mapping) and given else get_rule(name)
        cols = list(check_rule_columns(rule, names, mu=mu))

        def decide(batch: pl.Series, rule: Rule = rule) -> pl.Series:
            return evaluate_columns([rule], batch.struct.unnest(), mu=mu)[rule.name]

        added.append(
            pl.struct(cols)
            .map_batches(decide, return_dtype=pl.Boolean, is_elementwise=True)
            .alias(blocked_column(name))
        )
    return tokens.with_columns(added) if added else tokens


def blocked_per_step(
    tokens: RunOrTokens, rules: Rules = None, *, aggregates: pl.LazyFrame | None = None
) -> pl.DataFrame:
    """Per step and rule: step, rule, count, blocked, blocked_frac; sorted by step, rule order.

    aggregates: the exact aggregates of all tokens (`Run.aggregates` of a sampled run, limited to
        the steps wanted): counts from them, not from the kept rows. Otherwise a sampled run's
        rows count with their weights (estimates)."""
    tokens, aggregates = token_rows("blocked_per_step", tokens, aggregates)
    rules = checked_rules(tokens, rules)
    if aggregates is not None:
        wide = step_aggregates(aggregates)
    else:
        wide = collect(tokens.group_by("step").agg(blocked_aggs(rules, weights=weighted(tokens))).sort("step"))
    return long_by_rule(wide, ["step"], rules).sort("step", maintain_order=True)


def blocked_by_token(tokens: RunOrTokens, rules: Rules = None, *, top: int = 20, min_count: int = 1) -> pl.DataFrame:
    """The most-blocked token texts of each rule: rule, token, count, blocked, blocked_frac.

    For each rule, the `top` token texts with the most blocked rows (ties: higher fraction, then
    text), among texts occurring at least `min_count` times; texts a rule never blocks are left
    out. `count` is how often the text occurs (where the rule was evaluated). Token text is
    untrusted: render it escaped (trustlens.plots does).
    """
    tokens = lazy_rows("blocked_by_token", tokens)
    rules = checked_rules(tokens, rules)
    check_int("top", top, low=1)
    check_int("min_count", min_count, low=1)
    # grouping on the (categorical) column itself is ~5× faster than on its text; two categories
    # with one text (parts written with different dictionaries) are summed after the cast
    sums = [pl.col(c).sum() for r in rules for c in (f"n_{r}", f"k_{r}")]
    wide = collect(tokens.group_by("token").agg(blocked_aggs(rules, weights=weighted(tokens))))
    wide = wide.with_columns(pl.col("token").cast(pl.String)).group_by("token").agg(sums)
    long = long_by_rule(wide, ["token"], rules)
    order = pl.col("rule").replace_strict({r: i for i, r in enumerate(rules)}, return_dtype=pl.Int32)
    return (
        long.filter((pl.col("blocked") > 0) & (pl.col("count") >= min_count))
        .sort(
            [order, pl.col("blocked"), pl.col("blocked_frac"), pl.col("token")], descending=[False, True, True, False]
        )
        .group_by("rule", maintain_order=True)
        .head(top)
        .select("rule", "token", "count", "blocked", "blocked_frac")
    )


def blocked_by_bucket(
    tokens: RunOrTokens, rules: Rules = None, *, min_p: float = MIN_P, per_decade: int = PER_DECADE
) -> pl.DataFrame:
    """Per anchor-probability bucket and rule: bucket, p_lo, p_hi, label, rule, count, blocked,
    blocked_frac; every bucket is listed (count 0 where no token falls). Rows with a null anchor
    are left out."""
    tokens = lazy_rows("blocked_by_bucket", tokens)
    rules = checked_rules(tokens, rules)
    anchor = anchor_column(tokens)
    wide = collect(
        tokens.filter(pl.col(anchor).is_not_null())
        .group_by(bucket_expr(anchor, min_p, per_decade).alias("bucket"))
        .agg(blocked_aggs(rules, weights=weighted(tokens)))
    )
    wide = bucket_table(min_p, per_decade).join(wide, on="bucket", how="left", maintain_order="left")
    wide = wide.with_columns(pl.col(f"n_{r}").fill_null(0) for r in rules)
    return long_by_rule(wide, ["bucket", "p_lo", "p_hi", "label"], rules)


def blocked_by_advantage_sign(tokens: RunOrTokens, rules: Rules = None) -> pl.DataFrame:
    """Per advantage sign (pos A > 0, neg A < 0, zero A = 0) and rule: sign, rule, count, blocked,
    blocked_frac. Rows with a null advantage are left out. The zero row counts the A = 0 tokens
    where the rule was evaluated; none of them is blocked."""
    tokens = lazy_rows("blocked_by_advantage_sign", tokens)
    rules = checked_rules(tokens, rules)
    adv = pl.col("advantage")
    sign = pl.when(adv > 0).then(pl.lit("pos")).when(adv < 0).then(pl.lit("neg")).otherwise(pl.lit("zero"))
    wide = collect(
        tokens.filter(adv.is_not_null())
        .group_by(sign.alias("sign"))
        .agg(blocked_aggs(rules, with_zero=True, weights=weighted(tokens)))
    )
    signs = pl.DataFrame({"sign": list(ADVANTAGE_SIGNS)})
    wide = signs.join(wide, on="sign", how="left", maintain_order="left")
    wide = wide.with_columns(pl.col(f"n_{r}").fill_null(0) for r in rules)
    return long_by_rule(wide, ["sign"], rules)


# ---------------------------------------------------------------- Figure 1 of the DPPO paper

# Default y ranges of the Figure-1 densities: log10(ratio) in [-1, 1]; binary TV in [0, 0.5].
RATIO_LOG10_RANGE = (-1.0, 1.0)
TV_RANGE = (0.0, 0.5)


def figure1_density(
    tokens: RunOrTokens,
    y: str = "ratio",
    *,
    rules: Rules = (),
    n_x: int = 60,
    n_y: int = 60,
    min_p: float = MIN_P,
    y_range: tuple[float, float] | None = None,
) -> pl.DataFrame:
    """A 2-D histogram of a per-token quantity against the anchor probability (the paper's
    Figure 1, binned so that a run of any size gives at most n_x · n_y cells).

    x: log10 of the anchor probability, `n_x` equal bins over [log10 min_p, 0]. y: `ratio` is
    binned as log10(ratio) over `y_range` (default ±1, ratios 0.1–10), `binary_tv` (or any other
    column) linearly over `y_range` (default [0, 0.5]). Values outside a range fall into its edge
    bin. Columns: x_bin, y_bin, x_lo, x_hi (probabilities), y_lo, y_hi (in y's own units), count
    (every token in the cell), count_nonzero (its A ≠ 0 tokens, the base of block rates) and
    blocked_<rule> (blocked tokens in the cell) for each of `rules`; in a sampled run, tokens the
    kept rows stand for (Σ weight, rounded). Only non-empty cells.
    """
    tokens = lazy_rows("figure1_density", tokens)
    rules = checked_rules(tokens, rules)
    check_int("n_x", n_x, low=1)
    check_int("n_y", n_y, low=1)
    check_fraction("min_p", min_p, zero=False, one=False)
    names = tokens.collect_schema().names()
    check_choice("y", y, names)
    log_y = y == "ratio"
    lo, hi = check_interval("y_range", y_range or (RATIO_LOG10_RANGE if log_y else TV_RANGE))
    anchor = anchor_column(tokens)
    x_lo = np.log10(min_p)
    xv = pl.col(anchor).cast(pl.Float64) / LN10
    yv = pl.col(y).cast(pl.Float64)
    if log_y:
        yv = yv.log10()
    count = token_counter(tokens)
    x_bin = ((xv - x_lo) / (-x_lo) * n_x).floor().clip(0, n_x - 1).cast(pl.Int32)
    y_bin = ((yv - lo) / (hi - lo) * n_y).floor().clip(0, n_y - 1).cast(pl.Int32)
    lf = (
        tokens.filter(pl.col(anchor).is_not_null() & pl.col(y).is_not_null() & pl.col(y).is_finite())
        .filter(pl.col(y) > 0 if log_y else pl.lit(True))
        .group_by(x_bin.alias("x_bin"), y_bin.alias("y_bin"))
        .agg(
            count(None).alias("count"),
            count(nonzero_advantage()).alias("count_nonzero"),
            *(count(pl.col(blocked_column(r)).fill_null(False)).alias(blocked_column(r)) for r in rules),
        )
        .sort("x_bin", "y_bin")
    )
    df = collect(lf)
    dx, dy = -x_lo / n_x, (hi - lo) / n_y
    return (
        df.with_columns(
            (10 ** (x_lo + pl.col("x_bin") * dx)).alias("x_lo"),
            (10 ** (x_lo + (pl.col("x_bin") + 1) * dx)).alias("x_hi"),
            (lo + pl.col("y_bin") * dy).alias("y_lo"),
            (lo + (pl.col("y_bin") + 1) * dy).alias("y_hi"),
        )
        .with_columns(
            (10 ** pl.col("y_lo")).alias("y_lo") if log_y else pl.col("y_lo"),
            (10 ** pl.col("y_hi")).alias("y_hi") if log_y else pl.col("y_hi"),
        )
        .select(
            "x_bin",
            "y_bin",
            "x_lo",
            "x_hi",
            "y_lo",
            "y_hi",
            "count",
            "count_nonzero",
            *(blocked_column(r) for r in rules),
        )
    )


def _solve_binary_kl(mu: np.ndarray, delta: float, above: bool) -> np.ndarray:
    """π with KL(μ_bin ‖ π_bin) = delta, π > μ when `above` else π < μ (bisection, float64);
    NaN where no float64 π reaches it (small μ, π < μ: the KL stays below delta until π
    underflows, so the rule never blocks such a token)."""
    lo = mu.copy() if above else np.zeros_like(mu)
    hi = np.ones_like(mu) if above else mu.copy()

    def kl(pi: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return mu * np.log(mu / pi) + (1 - mu) * np.log((1 - mu) / (1 - pi))

    for _ in range(80):
        mid = 0.5 * (lo + hi)
        beyond = kl(mid) > delta
        if above:
            hi, lo = np.where(beyond, mid, hi), np.where(beyond, lo, mid)
        else:
            lo, hi = np.where(beyond, mid, lo), np.where(beyond, hi, mid)
    pi = 0.5 * (lo + hi)
    return np.where(np.abs(kl(pi) - delta) <= 1e-6 * delta, pi, np.nan)


def rule_boundaries(
    rules: Mapping[str, Mapping[str, float | None]] | Sequence[str], *, min_p: float = MIN_P, n: int = 200
) -> pl.DataFrame:
    """Where each rule starts to block, drawn in the Figure-1 planes (ratio vs μ and TV vs μ).

    `rules`: names (default thresholds from trustlens.rules.RULES) or the manifest's
    {name: {low, high, ...}}. For each rule that compares π with μ through the ratio, the binary
    TV or the binary KL, two curves over μ in [min_p, 1] (n log-spaced points):
    side "upper" (A > 0: the token is blocked once π rises beyond it) and "lower" (A < 0).
    Columns: rule, side, mu, pi, ratio (= π/μ), tv (= |π − μ|). Points where the boundary
    leaves [0, 1] are dropped. Rules anchored on π_old, top-K rules (not a function of μ alone) and
    rules that never block have no curve.

        ratio rule:      π = μ(1 + high),   π = μ(1 − low)
        binary TV rule:  π = μ + high,      π = μ − low
        binary KL rule:  KL(μ_bin ‖ π_bin) = high (π > μ),  = low (π < μ)
    """
    from trustlens.rules import RULES, get_rule

    check_fraction("min_p", min_p, zero=False, one=False)
    check_int("n", n, low=2)
    if isinstance(rules, Mapping):
        resolved = check_rule_entries("rules", rules)
    else:
        resolved = {name: get_rule(name) for name in check_names("rules", rules)}
    mu = np.logspace(np.log10(min_p), 0.0, n)[:-1]  # μ = 1 leaves no room to move up
    frames = []
    for name, rule in resolved.items():
        if name not in RULES:  # a custom rule: its boundary is not known here
            continue
        if rule.anchor != "mu" or rule.measure not in ("ratio", "binary_tv", "binary_kl"):
            continue
        for side, bound in (("upper", rule.high), ("lower", rule.low)):
            if bound is None:
                continue
            if rule.measure == "ratio":
                pi = mu * (1 + bound if side == "upper" else 1 - bound)
            elif rule.measure == "binary_tv":
                pi = mu + bound if side == "upper" else mu - bound
            else:
                pi = _solve_binary_kl(mu, bound, side == "upper")
            keep = (pi > 0) & (pi < 1)
            frames.append(
                pl.DataFrame(
                    {
                        "rule": name,
                        "side": side,
                        "mu": mu[keep],
                        "pi": pi[keep],
                        "ratio": pi[keep] / mu[keep],
                        "tv": np.abs(pi[keep] - mu[keep]),
                    }
                )
            )
    if not frames:
        return pl.DataFrame(
            schema={
                "rule": pl.String,
                "side": pl.String,
                "mu": pl.Float64,
                "pi": pl.Float64,
                "ratio": pl.Float64,
                "tv": pl.Float64,
            }
        )
    return pl.concat(frames)


__all__ = [
    "blocked_by_advantage_sign",
    "blocked_by_bucket",
    "blocked_by_token",
    "blocked_per_step",
    "figure1_density",
    "rule_boundaries",
    "with_rules",
]
