"""How a rule's thresholds move its mask: rules re-evaluated on a run's tokens at scaled thresholds.

A recorded run stores one decision per rule (`blocked_<rule>`) at the thresholds it was recorded
with. `threshold_sweep` asks what each rule would have blocked at other thresholds: for a scale
s, the rule's thresholds become (s · low, s · high) — ε for the ratio rules, δ for the DPPO
rules — and the rule is decided again on every token by `trustlens.rules.columns.evaluate_columns` (the
recorder's decision function on the run's columns, no torch), so at s = 1 the sweep reproduces
the recorded columns. Scaling every rule by the same factors puts PPO's ε and DPPO's δ, which
live in different units, on one axis. Block rates are over A ≠ 0 tokens (docs/rules.md).

The table is read in batches of `batch_rows` rows (polars' streaming engine), so a run of any
size is swept in bounded memory; the result has one row per rule × scale (× bucket).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl

from trustlens.analysis.buckets import (
    MIN_P,
    PER_DECADE,
    anchor_column,
    bucket_expr,
    bucket_table,
    row_weight,
    rules_of,
    weighted,
)
from trustlens.analysis.sources import RunOrTokens, check_rule_entries, lazy_rows
from trustlens.core.argument_checks import check_int, check_names, check_numbers
from trustlens.rules import Rule, get_rule, rule_from_manifest
from trustlens.rules.columns import check_rule_columns, evaluate_columns, not_redecidable
from trustlens.run.reader import Run

# Default scales of every rule's thresholds: a quarter of the recorded thresholds up to four times.
DEFAULT_SCALES: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)
# Token rows read at a time.
BATCH_ROWS = 1 << 20
# Advantage sides counted apart, in cell order.
_SIDES = ("neg", "pos", "zero")

SWEEP_SCHEMA: dict[str, pl.DataType] = {
    "rule": pl.String(),
    "scale": pl.Float64(),  # factor applied to both thresholds
    "low": pl.Float64(),  # threshold used when A < 0
    "high": pl.Float64(),  # threshold used when A > 0
    "count": pl.Int64(),  # A ≠ 0 tokens where the rule could be evaluated (a sampled run: Σ weight, rounded)
    "blocked": pl.Int64(),  # of those, tokens it blocks at these thresholds
    "blocked_frac": pl.Float64(),  # blocked / count (null when count is 0)
    "count_pos": pl.Int64(),  # tokens with A > 0 (the `high` side)
    "blocked_frac_pos": pl.Float64(),
    "count_neg": pl.Int64(),  # tokens with A < 0 (the `low` side)
    "blocked_frac_neg": pl.Float64(),
    "count_zero": pl.Int64(),  # tokens with A = 0: no gradient, never blocked, not in `count`
}


def _resolve(names: Sequence[str], base: Mapping[str, Mapping] | None, *, skip: bool = False) -> dict[str, Rule]:
    """Each rule as the run recorded it (`base`, a manifest's rules: custom rules come back with
    their measure and anchor), else the registry's. skip=True (the rules were not named by the
    caller): a rule that cannot be rebuilt (a custom rule of a run recorded before manifests kept
    its measure) is left out with a warning naming it instead of stopping the other rules."""
    out = {}
    for name in names:
        given = (base or {}).get(name)
        try:
            out[name] = rule_from_manifest(name, given) if isinstance(given, Mapping) and given else get_rule(name)
        except (KeyError, ValueError) as err:
            if not skip:
                raise
            warnings.warn(f"threshold_sweep: rule {name!r} left out: {err.args[0]}", stacklevel=3)
    return out


def threshold_sweep(
    tokens: RunOrTokens,
    rules: str | Sequence[str] | None = None,
    scales: Sequence[float] = DEFAULT_SCALES,
    *,
    base: Mapping[str, Mapping] | None = None,
    by_bucket: bool = False,
    min_p: float = MIN_P,
    per_decade: int = PER_DECADE,
    batch_rows: int = BATCH_ROWS,
) -> pl.DataFrame:
    """What each rule blocks with its thresholds scaled by each of `scales` (module docstring).

    rules: rules to sweep (default: every blocking rule evaluated in the run); a rule need not
        have been evaluated in the run, but the columns it reads must be there (π_old for the
        `*_recompute` and `minirl` rules, topk_tv / topk_kl for the top-K rules).
    base: {rule: {"low", "high", ...}} thresholds the scales multiply — pass `Run.rules` (the
        manifest's, which also brings back custom rules) so that scale 1 is what the run
        recorded; default the RULES defaults.
    by_bucket: also split by the anchor probability's bucket (`analysis.bucket_table`: bucket,
        p_lo, p_hi, label), to see where in μ each threshold bites.

    The anchor is μ, or π_old in a run without μ (as the recorder anchors it). Rows where a rule's
    inputs are null (no π_old, no top-K, no advantage) are not counted for that rule. Block rates
    are over A ≠ 0 tokens; A = 0 tokens (never blocked) are counted apart in `count_zero`. In a
    sampled run (`Keep`) each kept row counts its `weight`: the counts estimate the run's tokens
    (rounded), and at scales below 1 the random share stands for the tokens not kept that the
    rule would now block.
    Columns: rule, scale, low, high, [bucket, p_lo, p_hi, label,] count, blocked, blocked_frac,
    count_pos, blocked_frac_pos (A > 0), count_neg, blocked_frac_neg (A < 0), count_zero.
    """
    if base is None and isinstance(tokens, Run):
        base = tokens.rules
    elif base is not None:
        check_rule_entries("base", base)
    tokens = lazy_rows("threshold_sweep", tokens)
    names = tokens.collect_schema().names()
    anchor = anchor_column(tokens)
    if rules is None:
        recorded = _resolve(rules_of(tokens), base, skip=True).items()
        rules = [r for r, rule in recorded if rule.blocks and rule.level != "batch"]  # batch: not re-decided
    rules = [rules] if isinstance(rules, str) else check_names("rules", rules)
    resolved = _resolve(rules, base)
    thresholds: dict[str, tuple[float, float]] = {}
    for name, rule in resolved.items():
        not_redecidable(rule)
        if not rule.blocks or rule.low is None or rule.high is None:
            raise ValueError(f"rules: {name!r} never blocks a token, so it has no threshold to sweep")
        thresholds[name] = (rule.low, rule.high)
    scales = check_numbers("scales", scales, low=0.0, low_open=True)
    check_int("batch_rows", batch_rows, low=1)
    needs = {r: check_rule_columns(rule, names, mu=anchor) for r, rule in resolved.items()}
    inputs = sorted({c for cols in needs.values() for c in cols})
    n_buckets = bucket_table(min_p, per_decade).height
    size = n_buckets * len(_SIDES)
    # counts[rule] is (n_buckets, 3), blocked[rule] (scales, n_buckets, 3), Σ weight; sides as in _SIDES
    counts = {r: np.zeros((n_buckets, len(_SIDES))) for r in rules}
    blocked = {r: np.zeros((len(scales), n_buckets, len(_SIDES))) for r in rules}
    adv = pl.col("advantage")
    side = pl.when(adv < 0).then(0).when(adv > 0).then(1).otherwise(2)
    query = tokens.select(
        *map(pl.col, inputs),
        (bucket_expr(anchor, min_p, per_decade).fill_null(0) * len(_SIDES) + side).alias("_cell"),
        (row_weight() if weighted(tokens) else pl.lit(1.0)).alias("_weight"),
    )
    for batch in query.collect_batches(chunk_size=batch_rows):
        cell = batch["_cell"].to_numpy().astype(np.int64)
        weight = batch["_weight"].to_numpy()
        for i, s in enumerate(scales):
            scaled = [rule.with_thresholds(s * thresholds[r][0], s * thresholds[r][1]) for r, rule in resolved.items()]
            decided = evaluate_columns(scaled, batch, mu=anchor)
            for r in rules:
                col = decided[r]
                known = col.is_not_null().to_numpy()
                if i == 0:
                    counts[r] += np.bincount(cell[known], weight[known], size).reshape(n_buckets, len(_SIDES))
                hit = col.fill_null(False).to_numpy()
                blocked[r][i] += np.bincount(cell[hit], weight[hit], size).reshape(n_buckets, len(_SIDES))
    return _table(rules, scales, thresholds, counts, blocked, by_bucket, min_p, per_decade)


def _table(rules, scales, thresholds, counts, blocked, by_bucket, min_p, per_decade) -> pl.DataFrame:
    buckets = bucket_table(min_p, per_decade)
    neg, pos, zero = (_SIDES.index(x) for x in ("neg", "pos", "zero"))
    records = []
    for r in rules:
        low, high = thresholds[r]
        for i, s in enumerate(scales):
            n, k = counts[r], blocked[r][i]
            if not by_bucket:
                n, k = n.sum(0, keepdims=True), k.sum(0, keepdims=True)
            n, k = np.rint(n).astype(np.int64), np.rint(k).astype(np.int64)
            for b in range(n.shape[0]):
                records.append(
                    {
                        "rule": r,
                        "scale": s,
                        "low": s * low,
                        "high": s * high,
                        "bucket": b,
                        "count": int(n[b, pos] + n[b, neg]),
                        "blocked": int(k[b, pos] + k[b, neg]),
                        "count_pos": int(n[b, pos]),
                        "blocked_pos": int(k[b, pos]),
                        "count_neg": int(n[b, neg]),
                        "blocked_neg": int(k[b, neg]),
                        "count_zero": int(n[b, zero]),
                    }
                )
    counted = ("count", "blocked", "count_pos", "blocked_pos", "count_neg", "blocked_neg", "count_zero")
    schema = {
        "rule": pl.String,
        "scale": pl.Float64,
        "low": pl.Float64,
        "high": pl.Float64,
        "bucket": pl.Int32,
        **{c: pl.Int64 for c in counted},
    }
    df = pl.DataFrame(records, schema=schema)

    def frac(k: str, n: str) -> pl.Expr:
        return pl.when(pl.col(n) > 0).then(pl.col(k) / pl.col(n))

    df = df.with_columns(
        frac("blocked", "count").alias("blocked_frac"),
        frac("blocked_pos", "count_pos").alias("blocked_frac_pos"),
        frac("blocked_neg", "count_neg").alias("blocked_frac_neg"),
    )
    keys = ["rule", "scale", "low", "high"]
    if by_bucket:
        df = df.join(buckets, on="bucket", how="left", maintain_order="left")
        keys += ["bucket", "p_lo", "p_hi", "label"]
    return df.select(*keys, *(c for c in SWEEP_SCHEMA if c not in keys))


__all__ = ["BATCH_ROWS", "DEFAULT_SCALES", "SWEEP_SCHEMA", "threshold_sweep"]
