"""Shared pieces of the run queries: log-spaced probability buckets, the token table's rules and
anchor, and how a lazy query is collected.

Probability buckets are log-spaced: with `per_decade` buckets per power of ten, bucket edges are
10^(k/per_decade), from `min_p` up to 1; the lowest bucket also holds every probability below
`min_p` (its lower edge is 0) and the highest one includes p = 1. Bucket 0 is the least likely.
The bucket of a token is computed from its log-probability, so a probability of 1e-30 is bucketed
exactly (no underflow).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Sequence
from typing import Literal

import polars as pl

from trustlens.analysis.tokens import anchor_column, rules_of
from trustlens.core.argument_checks import check_fraction, check_int, check_str
from trustlens.run import blocked_column

LN10 = math.log(10.0)

# Defaults of every bucketed query: one bucket per decade from 1e-6 to 1.
MIN_P = 1e-6
PER_DECADE = 1
# The most buckets per decade (a finer split leaves each bucket a handful of tokens).
MAX_PER_DECADE = 1000


def _lowest_k(min_p: float, per_decade: int) -> int:
    check_fraction("min_p", min_p, zero=False, one=False)
    check_int("per_decade", per_decade, low=1, high=MAX_PER_DECADE)
    return math.floor(round(math.log10(min_p) * per_decade, 9))


def bucket_table(min_p: float = MIN_P, per_decade: int = PER_DECADE) -> pl.DataFrame:
    """The buckets: `bucket` (0 = least likely), `p_lo`, `p_hi` (probability edges, the bucket is
    [p_lo, p_hi), the top one includes 1) and a readable `label`."""
    k0 = _lowest_k(min_p, per_decade)
    ks = list(range(k0, 0))
    lo = [0.0 if i == 0 else 10.0 ** (k / per_decade) for i, k in enumerate(ks)]
    hi = [10.0 ** ((k + 1) / per_decade) for k in ks]
    labels = [
        f"< {h:.0e}" if i == 0 else (f"[{l:.2g}, 1]" if i == len(ks) - 1 else f"[{l:.0e}, {h:.0e})")
        for i, (l, h) in enumerate(zip(lo, hi, strict=True))
    ]
    return pl.DataFrame(
        {"bucket": list(range(len(ks))), "p_lo": lo, "p_hi": hi, "label": labels},
        schema={"bucket": pl.Int32, "p_lo": pl.Float64, "p_hi": pl.Float64, "label": pl.String},
    )


def bucket_expr(logp: str | pl.Expr, min_p: float = MIN_P, per_decade: int = PER_DECADE) -> pl.Expr:
    """The bucket index (Int32, see `bucket_table`) of a log-probability column; null stays null."""
    k0 = _lowest_k(min_p, per_decade)
    col = pl.col(logp) if isinstance(logp, str) else logp
    k = (col.cast(pl.Float64) / LN10 * per_decade).floor().clip(k0, -1)
    return (k - k0).cast(pl.Int32)


# The engine `collect` runs queries with: "streaming" (bounded memory on runs of any size), or
# "in-memory" inside `in_memory()`, for queries on a few rows already in memory, where the
# streaming engine's setup costs more than the work (the live monitor's one step).
Engine = Literal["streaming", "in-memory"]
_ENGINE: contextvars.ContextVar[Engine] = contextvars.ContextVar("trustlens_engine", default="streaming")


@contextlib.contextmanager
def in_memory() -> Iterator[None]:
    """Within it, `collect` runs queries with polars' in-memory engine (module comment above)."""
    token = _ENGINE.set("in-memory")
    try:
        yield
    finally:
        _ENGINE.reset(token)


def reused(lf: pl.LazyFrame) -> pl.LazyFrame:
    """A query that several others read: computed once inside `in_memory()` (a few rows: its
    result is small, and reading it again is cheaper than computing it again), else left lazy
    (a whole run's rows, streamed by each reader)."""
    return collect(lf).lazy() if _ENGINE.get() == "in-memory" else lf


def collect(lf: pl.LazyFrame) -> pl.DataFrame:
    """Run a query with polars' streaming engine (bounded memory on runs of any size); the
    in-memory one inside `in_memory()`."""
    return lf.collect(engine=_ENGINE.get())


def checked_rules(tokens: pl.LazyFrame, rules: str | Sequence[str] | None) -> list[str]:
    """`rules` (None: every rule evaluated in the run), each checked to have a blocked column."""
    have = rules_of(tokens)
    if rules is None:
        return have
    if not isinstance(rules, (str, list, tuple)):
        raise TypeError(f"rules must be a rule name or a list of them, got {type(rules).__name__} {rules!r:.80}")
    wanted = [rules] if isinstance(rules, str) else list(rules)
    for i, r in enumerate(wanted):
        check_str(f"rules[{i}]", r)
    missing = [r for r in wanted if r not in have]
    if missing:
        raise ValueError(
            f"rules: {', '.join(map(repr, missing))} not evaluated in this run "
            f"(it has blocked columns for: {', '.join(have) or 'none'})"
        )
    return wanted


def nonzero_advantage() -> pl.Expr:
    """Rows that count in a block rate: advantage ≠ 0 (a null advantage, unknown, counts too).
    A token with A = 0 carries no gradient and no rule blocks it (docs/rules.md)."""
    return pl.col("advantage").is_null() | (pl.col("advantage") != 0)


def row_weight() -> pl.Expr:
    """Each row's sampling weight (Float64): `weight` of a run recorded with `Keep`, 1 for a row
    of a full run (null weight). Σ weight estimates the number of tokens the rows stand for."""
    return pl.col("weight").cast(pl.Float64).fill_null(1.0)


def weighted(tokens: pl.LazyFrame) -> bool:
    """Whether the token table carries sampling weights (a `weight` column, schema ≥ 2)."""
    return "weight" in tokens.collect_schema().names()


def weighted_count(keep: pl.Expr | None = None) -> pl.Expr:
    """Σ weight of the rows where `keep` holds (None: all rows): the number of tokens they stand
    for."""
    return row_weight().sum() if keep is None else pl.when(keep).then(row_weight()).sum()


def token_counter(tokens: pl.LazyFrame):
    """count(cond) → Int64 number of tokens where `cond` holds (None: every row): rows, or for a
    table with sampling weights Σ weight rounded (the tokens the rows stand for)."""
    if weighted(tokens):
        return lambda cond: weighted_count(cond).round().cast(pl.Int64)
    return lambda cond: (pl.len() if cond is None else cond.sum()).cast(pl.Int64)


def weighted_mean(x: pl.Expr, where: pl.Expr | None = None, *, weights: bool = True) -> pl.Expr:
    """Σ w·x / Σ w over the rows where `where` holds (None: all) and x is not null: the mean of x
    over the tokens the rows stand for (the plain mean without `weights`); null without rows.
    Masks, not filters, so that polars' streaming engine aggregates it in bounded memory."""
    x = x.cast(pl.Float64)
    if where is not None:
        x = pl.when(where).then(x)
    if not weights:
        return x.mean()
    total = pl.when(x.is_not_null()).then(row_weight()).sum()
    return pl.when(total > 0).then((x * row_weight()).sum() / total)


def weighted_quantile(x: pl.Expr, q: float, where: pl.Expr | None = None) -> pl.Expr:
    """The q-quantile of x over the tokens the rows stand for (each row counted `weight` times),
    among the rows where `where` holds (None: all) and x is not null: the smallest x whose
    cumulative weight, rows in x order, reaches q·Σ w (the inverse of the weighted CDF); null
    without rows."""
    w = row_weight()
    if where is not None:
        x, w = x.filter(where), w.filter(where)
    present = x.is_not_null()
    x, w = x.filter(present), w.filter(present)
    order = x.arg_sort()
    cumulative = w.gather(order).cum_sum()
    return x.gather(order).filter(cumulative >= q * cumulative.last()).first()


def zero_advantage_frac(*, weights: bool = False) -> pl.Expr:
    """The share of tokens with A = 0 (of those with a known advantage), as `zero_adv_frac`;
    with `weights`, each row counts its sampling weight."""
    adv = pl.col("advantage")
    return weighted_mean(adv == 0, weights=weights).alias("zero_adv_frac")


def blocked_aggs(rules: list[str], *, with_zero: bool = False, weights: bool = False) -> list[pl.Expr]:
    """Per rule: `n_<rule>` (A ≠ 0 rows where the rule was evaluated) and `k_<rule>` (rows it
    blocks). With `with_zero`, A = 0 rows count in `n_` too (for a table split by sign). With
    `weights`, each row counts its sampling weight (estimated token counts, Float64)."""
    out: list[pl.Expr] = []
    for r in rules:
        col = pl.col(blocked_column(r))
        keep = col.is_not_null() if with_zero else col.is_not_null() & nonzero_advantage()
        if weights:
            n = weighted_count(keep)
            k = weighted_count(keep & col)
        else:
            n = keep.cast(pl.Int64).sum()
            k = (keep & col).cast(pl.Int64).sum()
        out += [n.alias(f"n_{r}"), k.alias(f"k_{r}")]
    return out


def blocked_rate(rule: str, *, weights: bool = False) -> pl.Expr:
    """The fraction of A ≠ 0 tokens (where `rule` was evaluated) that `rule` blocks, as
    blocked_<rule>; null when there is none. With `weights`, rows count their sampling weight."""
    col = pl.col(blocked_column(rule))
    return weighted_mean(col, nonzero_advantage(), weights=weights).alias(blocked_column(rule))


def long_by_rule(wide: pl.DataFrame, keys: list[str], rules: list[str]) -> pl.DataFrame:
    """`blocked_aggs` columns of `wide` as long rows: keys…, rule, count, blocked, blocked_frac
    (blocked / count; null where the rule was never evaluated)."""
    parts = [
        wide.select(
            *keys,
            pl.lit(r).alias("rule"),
            pl.col(f"n_{r}").round().cast(pl.Int64).alias("count"),
            pl.col(f"k_{r}").fill_null(0).round().cast(pl.Int64).alias("blocked"),
        )
        for r in rules
    ]
    if not parts:
        return pl.DataFrame(
            schema={
                **{k: wide.schema[k] for k in keys},
                "rule": pl.String,
                "count": pl.Int64,
                "blocked": pl.Int64,
                "blocked_frac": pl.Float64,
            }
        )
    long = pl.concat(parts)
    return long.with_columns(
        pl.when(pl.col("count") > 0).then(pl.col("blocked") / pl.col("count")).alias("blocked_frac")
    )


__all__ = [
    "LN10",
    "MIN_P",
    "PER_DECADE",
    "anchor_column",
    "blocked_aggs",
    "blocked_rate",
    "bucket_expr",
    "bucket_table",
    "checked_rules",
    "collect",
    "long_by_rule",
    "nonzero_advantage",
    "row_weight",
    "rules_of",
    "token_counter",
    "weighted",
    "weighted_count",
    "weighted_mean",
    "zero_advantage_frac",
]
