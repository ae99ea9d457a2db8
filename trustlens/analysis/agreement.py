"""How two trust-region rules' decisions on the same tokens compare (polars, lazy in, small
DataFrame out): per step or overall for one pair (`rule_confusion`), for every ordered pair at
once (`confusion_matrix`), and which pair a page or report compares by default.

As in trustlens.analysis.clipping, only A ≠ 0 tokens where both rules were evaluated count: no
rule blocks a token with A = 0, so counting them would inflate the agreement.
"""

from __future__ import annotations

import polars as pl

from trustlens.analysis.buckets import checked_rules, collect, nonzero_advantage, token_counter
from trustlens.analysis.clipping import Rules
from trustlens.analysis.sources import RunOrTokens, lazy_rows, token_rows
from trustlens.core.argument_checks import check_bool
from trustlens.metrics import SIGNS
from trustlens.run import blocked_column


def default_rule_pair(rules: list[str]) -> tuple[str, str]:
    """The two rules compared by default (PPO vs DPPO page, report): the first ratio rule and
    the first DPPO rule, else the first two rules. Needs at least two rules."""
    ratio = [r for r in rules if not r.startswith("dppo")]
    a = ratio[0] if ratio else rules[0]
    b = next((r for r in rules if r.startswith("dppo") and r != a), next(r for r in rules if r != a))
    return a, b


def rule_confusion(
    tokens: RunOrTokens,
    rule_a: str,
    rule_b: str,
    *,
    per_step: bool = True,
    aggregates: pl.LazyFrame | None = None,
) -> pl.DataFrame:
    """How two rules' decisions on the same tokens compare, per step (or overall).

    Columns: [step,] count (A ≠ 0 rows where both rules were evaluated), both, only_a (blocked by
    `rule_a`, not by `rule_b`), only_b, neither, only_a_frac, only_b_frac (of count), agreement
    ((both + neither) / count). A = 0 tokens are left out: no rule blocks them, so counting them
    would inflate the agreement. A sampled run's rows count with their weights (estimates).

    aggregates: the exact aggregates of all tokens (`Run.aggregates` of a sampled run, limited to
        the steps of `tokens`), for two rules the run recorded: count and each rule's blocked
        tokens (both + only_a, both + only_b) then come from them, and only `both` from the kept
        rows, so that only_a = k_a − both and only_b = k_b − both. A sampled run keeps every
        token its active rule (and each rule of `Keep.rules`) blocks with weight 1: with one of
        those as rule_a or rule_b, `both` and so every column is exact; for two other rules
        `both` is the weighted count of the kept rows, an unbiased estimate (their tokens are
        kept at the sampling rate with weight 1/rate), and the rest follows from it.
    """
    tokens, aggregates = token_rows("rule_confusion", tokens, aggregates)
    checked_rules(tokens, [rule_a, rule_b])
    check_bool("per_step", per_step)
    count = token_counter(tokens)
    tokens = tokens.filter(nonzero_advantage())
    a, b = pl.col(blocked_column(rule_a)), pl.col(blocked_column(rule_b))
    aggs = [
        count(None).alias("count"),
        count(a & b).alias("both"),
        count(a & ~b).alias("only_a"),
        count(~a & b).alias("only_b"),
    ]
    lf = tokens.filter(a.is_not_null() & b.is_not_null())
    df = collect(lf.group_by("step").agg(aggs).sort("step") if per_step else lf.select(aggs))
    if aggregates is not None:
        exact = _decided_by_both(aggregates, rule_a, rule_b)
        if not per_step:
            exact = exact.select(pl.exclude("step").sum())
        df = (
            exact.join(df.select("step", "both"), on="step", how="left") if per_step else exact.with_columns(df["both"])
        )
        # an estimated `both` within what the exact counts allow (Fréchet's bounds)
        lowest = pl.max_horizontal(pl.lit(0), pl.col("k_a") + pl.col("k_b") - pl.col("count"))
        both = pl.col("both").fill_null(0).clip(lowest, pl.min_horizontal("k_a", "k_b"))
        df = df.with_columns(both).with_columns(
            (pl.col("k_a") - pl.col("both")).alias("only_a"), (pl.col("k_b") - pl.col("both")).alias("only_b")
        )
        df = df.select(*(["step"] if per_step else []), "count", "both", "only_a", "only_b")
    df = df.with_columns(pl.col("count", "both", "only_a", "only_b").cast(pl.Int64))
    return df.with_columns(
        (pl.col("count") - pl.col("both") - pl.col("only_a") - pl.col("only_b")).alias("neither"),
    ).with_columns(
        (pl.col("only_a") / pl.col("count")).alias("only_a_frac"),
        (pl.col("only_b") / pl.col("count")).alias("only_b_frac"),
        ((pl.col("both") + pl.col("neither")) / pl.col("count")).alias("agreement"),
    )


def _decided_by_both(aggregates: pl.LazyFrame, rule_a: str, rule_b: str) -> pl.DataFrame:
    """step, count, k_a, k_b: the A ≠ 0 tokens of the calls (aggregate rows) that evaluated both
    rules, and those of them each rule blocks."""
    names = aggregates.collect_schema().names()
    missing = [r for r in (rule_a, rule_b) if f"k_{r}_pos" not in names]
    if missing:
        raise ValueError(f"the aggregates hold no counts of {', '.join(map(repr, missing))}: not recorded by the run")

    def over_both(column: str) -> pl.Expr:  # Σ column over the signs' calls that evaluated both rules
        terms = [
            pl.when(pl.col(f"k_{rule_a}_{s}").is_not_null() & pl.col(f"k_{rule_b}_{s}").is_not_null())
            .then(pl.col(column.format(s=s)))
            .otherwise(0)
            for s in SIGNS
        ]
        return pl.sum_horizontal(terms).sum().cast(pl.Int64)

    sums = [
        over_both("tokens_{s}").alias("count"),
        over_both(f"k_{rule_a}_{{s}}").alias("k_a"),
        over_both(f"k_{rule_b}_{{s}}").alias("k_b"),
    ]
    return collect(aggregates.group_by("step").agg(sums).sort("step")).with_columns(pl.col("step").cast(pl.Int32))


def confusion_matrix(tokens: RunOrTokens, rules: Rules = None) -> pl.DataFrame:
    """For every ordered pair of rules: rule_a, rule_b, count, only_a, only_a_frac — the tokens
    `rule_a` blocks and `rule_b` lets through (rule_a == rule_b gives 0), among the A ≠ 0 tokens
    where both were evaluated (a sampled run's rows count with their weights). One pass over the
    table.
    """
    tokens = lazy_rows("confusion_matrix", tokens)
    rules = checked_rules(tokens, rules)
    count = token_counter(tokens)
    tokens = tokens.filter(nonzero_advantage())
    aggs = []
    for ra in rules:
        for rb in rules:
            a, b = pl.col(blocked_column(ra)), pl.col(blocked_column(rb))
            aggs += [
                count(a.is_not_null() & b.is_not_null()).alias(f"n|{ra}|{rb}"),
                count((a & ~b).fill_null(False)).alias(f"k|{ra}|{rb}"),
            ]
    row = collect(tokens.select(aggs)).row(0, named=True) if aggs else {}
    records = [
        {"rule_a": ra, "rule_b": rb, "count": row[f"n|{ra}|{rb}"], "only_a": row[f"k|{ra}|{rb}"]}
        for ra in rules
        for rb in rules
    ]
    df = pl.DataFrame(records, schema={"rule_a": pl.String, "rule_b": pl.String, "count": pl.Int64, "only_a": pl.Int64})
    return df.with_columns(pl.when(pl.col("count") > 0).then(pl.col("only_a") / pl.col("count")).alias("only_a_frac"))


__all__ = ["confusion_matrix", "default_rule_pair", "rule_confusion"]
