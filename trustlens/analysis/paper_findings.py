"""The DPPO paper's token-level findings, located in a recorded run (polars, lazy in, small out).

    motivating_examples     the paper's two motivating cases among the run's real tokens: a rare
                            token pushed up that the ratio clip blocks and the divergence bound
                            lets through, and a near-certain token pushed down that the ratio
                            clip lets through although it moved far in probability
    blocked_anchor_quantiles  where in μ a rule's blocked tokens sit, against all tokens
    blocked_token_anchor    the most-blocked token texts with their median μ
    over_updates_per_step   per step and advantage sign, the tokens updated beyond a rule's trust
                            region in the direction their advantage asks for

Probabilities are reported as probabilities (not logs). The anchor is μ, or π_old in a run
without μ (`analysis.tokens.anchor_column`); `mu` in a result means that anchor.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from trustlens.analysis.buckets import (
    anchor_column,
    checked_rules,
    collect,
    token_counter,
    weighted,
    weighted_mean,
    weighted_quantile,
)
from trustlens.analysis.clipping import blocked_by_token
from trustlens.analysis.sources import RunOrTokens, lazy_rows
from trustlens.core.argument_checks import check_fraction, check_int, check_numbers
from trustlens.run import blocked_column

EXAMPLE_CASES = ("rare token pushed up", "near-certain token pushed down")
# A token counts as near-certain from this anchor probability on.
NEAR_CERTAIN = 0.5


def motivating_examples(
    tokens: RunOrTokens,
    ratio_rule: str = "ppo",
    divergence_rule: str = "dppo_binary_tv",
    *,
    n: int = 3,
    near_certain: float = NEAR_CERTAIN,
) -> pl.DataFrame:
    """The paper's two motivating cases found among real tokens, `n` rows of each:

    "rare token pushed up": A > 0 and π > μ, blocked by `ratio_rule` but not by
        `divergence_rule` — the ratio π/μ is large only because μ is small; the rows with the
        largest ratio first.
    "near-certain token pushed down": A < 0, π < μ, μ ≥ `near_certain`, not blocked by
        `ratio_rule` — the ratio stays near 1 while the probability mass moved; the rows with
        the largest |π − μ| first (those `divergence_rule` blocks, if any, lead).

    Columns: case, step, update, sample, pos, token, mu, pi (probabilities), ratio, binary_tv,
    advantage, blocked_<ratio_rule>, blocked_<divergence_rule>. A case with no such token in the
    run has no rows.
    """
    tokens = lazy_rows("motivating_examples", tokens)
    checked_rules(tokens, [ratio_rule, divergence_rule])
    check_int("n", n, low=1)
    check_fraction("near_certain", near_certain, zero=False, one=False)
    anchor = anchor_column(tokens)
    ratio_col, div_col = blocked_column(ratio_rule), blocked_column(divergence_rule)
    mu, pi = pl.col(anchor).cast(pl.Float64).exp(), pl.col("pi_logp").cast(pl.Float64).exp()
    adv = pl.col("advantage")
    cols = [
        pl.col("step", "update", "sample", "pos"),
        pl.col("token").cast(pl.String),
        mu.alias("mu"),
        pi.alias("pi"),
        (pl.col("pi_logp").cast(pl.Float64) - pl.col(anchor).cast(pl.Float64)).exp().alias("ratio"),
        (pi - mu).abs().alias("binary_tv"),
        adv.cast(pl.Float64),
        pl.col(ratio_col, div_col),
    ]
    up = (
        tokens.filter((adv > 0) & (pl.col("pi_logp") > pl.col(anchor)) & pl.col(ratio_col) & ~pl.col(div_col))
        .select(cols)
        .sort("ratio", descending=True)
        .head(n)
        .with_columns(pl.lit(EXAMPLE_CASES[0]).alias("case"))
    )
    down = (
        tokens.filter((adv < 0) & (pl.col("pi_logp") < pl.col(anchor)) & ~pl.col(ratio_col) & (mu >= near_certain))
        .select(cols)
        .sort([div_col, "binary_tv"], descending=[True, True])
        .head(n)
        .with_columns(pl.lit(EXAMPLE_CASES[1]).alias("case"))
    )
    out = collect(pl.concat([up, down]))
    return out.select("case", *(c for c in out.columns if c != "case"))


def blocked_anchor_quantiles(
    tokens: RunOrTokens, rules: str | Sequence[str] | None = None, quantiles: Sequence[float] = (0.1, 0.5, 0.9)
) -> pl.DataFrame:
    """Where in μ each rule's blocked tokens sit: a first row "all tokens", then one per rule.

    Columns: rule, tokens, then p<q> for each quantile q (e.g. p50, the median anchor probability
    of those rows; quantiles are taken on log μ and exponentiated, which is exact for order
    statistics). Rows without an anchor are left out. A table with sampling weights (schema ≥ 2;
    a sampled run keeps every low-μ token, so its rows overstate the tail) counts each row
    `weight` times: tokens is Σ weight and the quantiles are weighted (`weighted_quantile`);
    otherwise tokens counts rows and quantiles are polars' nearest-rank ones.
    """
    tokens = lazy_rows("blocked_anchor_quantiles", tokens)
    rules = checked_rules(tokens, rules)
    qs = check_numbers("quantiles", quantiles, low=0.0, high=1.0)
    anchor = anchor_column(tokens)
    logp = pl.col(anchor).cast(pl.Float64)

    count, weights = token_counter(tokens), weighted(tokens)

    def quantile(where: pl.Expr | None, q: float) -> pl.Expr:
        if weights:
            return weighted_quantile(logp, q, where)
        return (logp if where is None else logp.filter(where)).quantile(q, interpolation="nearest")

    def aggs(where: pl.Expr | None, name: str) -> list[pl.Expr]:
        return [
            count(where).alias(f"{name}|tokens"),
            *(quantile(where, q).exp().alias(f"{name}|p{round(q * 100):g}") for q in qs),
        ]

    groups = {"all tokens": None, **{r: pl.col(blocked_column(r)).fill_null(False) for r in rules}}
    row = collect(
        tokens.filter(pl.col(anchor).is_not_null()).select(
            [a for name, where in groups.items() for a in aggs(where, name)]
        )
    ).row(0, named=True)
    names = ["tokens", *(f"p{round(q * 100):g}" for q in qs)]
    return pl.DataFrame(
        [{"rule": g, **{c: row[f"{g}|{c}"] for c in names}} for g in groups],
        schema={"rule": pl.String, "tokens": pl.Int64, **{c: pl.Float64 for c in names[1:]}},
    )


def blocked_token_anchor(tokens: RunOrTokens, rule: str = "ppo", *, top: int = 20, min_count: int = 1) -> pl.DataFrame:
    """The `top` token texts `rule` blocks most (`clipping.blocked_by_token`) with where they
    sit in μ: token, count, blocked, blocked_frac, mu_median (median anchor probability over
    all occurrences of the text), mu_median_blocked (over the blocked ones); weighted medians
    (`weighted_quantile`) for a table with sampling weights. Token text is untrusted: render it
    escaped."""
    tokens = lazy_rows("blocked_token_anchor", tokens)
    top_tokens = blocked_by_token(tokens, rule, top=top, min_count=min_count).drop("rule")
    if top_tokens.is_empty():
        return top_tokens.with_columns(
            pl.lit(None, pl.Float64).alias("mu_median"), pl.lit(None, pl.Float64).alias("mu_median_blocked")
        )
    anchor = anchor_column(tokens)
    logp = pl.col(anchor).cast(pl.Float64)
    blocked = pl.col(blocked_column(rule)).fill_null(False)
    if weighted(tokens):
        median, median_blocked = weighted_quantile(logp, 0.5), weighted_quantile(logp, 0.5, blocked)
    else:
        median, median_blocked = logp.median(), logp.filter(blocked).median()
    medians = collect(
        tokens.filter(pl.col("token").cast(pl.String).is_in(top_tokens["token"].to_list()))
        .group_by(pl.col("token").cast(pl.String))
        .agg(median.exp().alias("mu_median"), median_blocked.exp().alias("mu_median_blocked"))
    )
    return top_tokens.join(medians, on="token", how="left", maintain_order="left")


def over_updates_per_step(tokens: RunOrTokens, rule: str = "dppo_binary_tv") -> pl.DataFrame:
    """Per step, split by the advantage's sign: how many tokens were updated beyond `rule`'s
    trust region in the direction their advantage asks for (π pushed up past the bound when
    A > 0, down past it when A < 0) — exactly the tokens `rule` blocks, counterfactually in a
    run trained under another rule. In a run without a trust region (pg_is, cispo) these updates
    happened; the paper finds collapse driven mostly by the ones on negative-advantage samples.

    Columns: step, count_pos, over_pos, over_frac_pos, tv_mean_pos (mean |π − μ| of the A > 0
    tokens), then the same with _neg for A < 0; sorted by step. A = 0 and rows where `rule` was
    not evaluated are left out. In a sampled run (`Keep`) counts and means are over the tokens
    the kept rows stand for (weighted).
    """
    tokens = lazy_rows("over_updates_per_step", tokens)
    checked_rules(tokens, [rule])
    over, adv = pl.col(blocked_column(rule)), pl.col("advantage")
    count, weights = token_counter(tokens), weighted(tokens)
    parts = []
    for side, where in (("pos", adv > 0), ("neg", adv < 0)):
        sel = where & over.is_not_null()
        parts += [
            count(sel).alias(f"count_{side}"),
            count(sel & over).alias(f"over_{side}"),
            weighted_mean(pl.col("binary_tv"), sel, weights=weights).alias(f"tv_mean_{side}"),
        ]
    df = collect(tokens.group_by("step").agg(parts).sort("step"))
    return df.select(
        pl.col("step").cast(pl.Int32),
        *(
            e
            for side in ("pos", "neg")
            for e in (
                pl.col(f"count_{side}"),
                pl.col(f"over_{side}"),
                pl.when(pl.col(f"count_{side}") > 0)
                .then(pl.col(f"over_{side}") / pl.col(f"count_{side}"))
                .alias(f"over_frac_{side}"),
                pl.col(f"tv_mean_{side}"),
            )
        ),
    )


__all__ = [
    "EXAMPLE_CASES",
    "NEAR_CERTAIN",
    "blocked_anchor_quantiles",
    "blocked_token_anchor",
    "motivating_examples",
    "over_updates_per_step",
]
