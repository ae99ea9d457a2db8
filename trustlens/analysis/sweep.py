"""How a rule's thresholds move its mask: rules re-evaluated on a run's tokens at scaled thresholds.

A recorded run stores one decision per rule (`blocked_<rule>`) at the thresholds it was recorded
with. `threshold_sweep` asks what each rule would have blocked at other thresholds: for a scale
s, the rule's thresholds become (s · low, s · high) — ε for the ratio rules, δ for the DPPO
rules — and the rule is evaluated again on every token by `trustlens.rules.evaluate_all`, the
function the recorder used, so at s = 1 the sweep reproduces the recorded columns. Scaling every
rule by the same factors puts PPO's ε and DPPO's δ, which live in different units, on one axis.

The table is read in batches of `batch_rows` rows (polars' streaming engine), so a run of any
size is swept in bounded memory; the result has one row per rule × scale (× bucket).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl
import torch

from trustlens.analysis.buckets import MIN_P, PER_DECADE, anchor_column, bucket_expr, bucket_table, rules_of
from trustlens.rules import evaluate_all, get_rule

# Default scales of every rule's thresholds: a quarter of the recorded thresholds up to four times.
DEFAULT_SCALES: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)
# Token rows converted to tensors at a time.
BATCH_ROWS = 1 << 20

SWEEP_SCHEMA: dict[str, pl.DataType] = {
    "rule": pl.String,
    "scale": pl.Float64,  # factor applied to both thresholds
    "low": pl.Float64,  # threshold used when A ≤ 0
    "high": pl.Float64,  # threshold used when A > 0
    "count": pl.Int64,  # tokens where the rule could be evaluated
    "blocked": pl.Int64,  # of those, tokens it blocks at these thresholds
    "blocked_frac": pl.Float64,  # blocked / count (null when count is 0)
    "count_pos": pl.Int64,  # tokens with A > 0 (the `high` side)
    "blocked_frac_pos": pl.Float64,
    "count_neg": pl.Int64,  # tokens with A ≤ 0 (the `low` side)
    "blocked_frac_neg": pl.Float64,
}


def _thresholds(rules: Sequence[str], base: Mapping[str, Mapping] | None) -> dict[str, tuple[float, float]]:
    """(low, high) of each rule: from `base` (a manifest's rules) where it has them, else RULES."""
    out = {}
    for name in rules:
        rule = get_rule(name)
        if not rule.blocks:
            raise ValueError(f"rules: {name!r} never blocks a token, so it has no threshold to sweep")
        given = (base or {}).get(name) or {}
        low = given.get("low") if given.get("low") is not None else rule.low
        high = given.get("high") if given.get("high") is not None else rule.high
        out[name] = (float(low), float(high))
    return out


def _check_scales(scales: Sequence[float]) -> list[float]:
    out = [float(s) for s in scales]
    if not out:
        raise ValueError("scales is empty: give at least one factor")
    bad = [s for s in out if not np.isfinite(s) or s < 0]
    if bad:
        raise ValueError(f"scales must be finite numbers ≥ 0, got {bad[0]!r}")
    return out


def _tensor(batch: pl.DataFrame, column: str, rows: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(batch[column].cast(pl.Float64).to_numpy()[rows])


def threshold_sweep(
    tokens: pl.LazyFrame,
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
    base: {rule: {"low", "high"}} thresholds the scales multiply — pass `Run.rules` (the
        manifest's) so that scale 1 is what the run recorded; default the RULES defaults.
    by_bucket: also split by the anchor probability's bucket (`analysis.bucket_table`: bucket,
        p_lo, p_hi, label), to see where in μ each threshold bites.

    The anchor is μ, or π_old in a run without μ (as the recorder anchors it). Rows where a rule's
    inputs are null (no π_old, no top-K, no advantage) are not counted for that rule.
    Columns: rule, scale, low, high, [bucket, p_lo, p_hi, label,] count, blocked, blocked_frac,
    count_pos, blocked_frac_pos (A > 0), count_neg, blocked_frac_neg (A ≤ 0).
    """
    names = tokens.collect_schema().names()
    if rules is None:
        rules = [r for r in rules_of(tokens) if get_rule(r).blocks]
    rules = [rules] if isinstance(rules, str) else list(rules)
    thresholds = _thresholds(rules, base)
    scales = _check_scales(scales)
    if not isinstance(batch_rows, int) or batch_rows < 1:
        raise ValueError(f"batch_rows must be a positive int, got {batch_rows!r}")
    anchor = anchor_column(tokens)
    needs = {r: get_rule(r).needs for r in rules}
    for r, cols in needs.items():
        missing = [c for c in cols if c not in names]
        if missing:
            raise ValueError(f"rules: {r!r} needs the column(s) {missing}, which the token table lacks")
    inputs = sorted({c for cols in needs.values() for c in cols})
    n_buckets = bucket_table(min_p, per_decade).height
    # counts[rule][scale index] is (n_buckets, 2) for the sides A ≤ 0 (0) and A > 0 (1)
    counts = {r: np.zeros((n_buckets, 2), np.int64) for r in rules}
    blocked = {r: np.zeros((len(scales), n_buckets, 2), np.int64) for r in rules}
    query = tokens.select(
        pl.col("pi_logp"),
        pl.col(anchor).alias("_anchor"),
        pl.col("advantage"),
        *map(pl.col, inputs),
        bucket_expr(anchor, min_p, per_decade).alias("_bucket"),
    )
    for batch in query.collect_batches(chunk_size=batch_rows):
        base_ok = batch.select(pl.all_horizontal(pl.col("pi_logp", "_anchor", "advantage").is_not_null())).to_series()
        # rules reading the same optional columns are evaluated together, on the same rows
        for group_needs in sorted(set(needs.values())):
            group = [r for r in rules if needs[r] == group_needs]
            ok = base_ok
            for c in group_needs:
                ok = ok & batch[c].is_not_null()
            rows = np.flatnonzero(ok.to_numpy())
            if rows.size == 0:
                continue
            cell = batch["_bucket"].to_numpy()[rows].astype(np.int64) * 2 + (batch["advantage"].to_numpy()[rows] > 0)
            size = n_buckets * 2
            given = {
                "pi_logp": _tensor(batch, "pi_logp", rows),
                "mu_logp": _tensor(batch, "_anchor", rows),
                "advantages": _tensor(batch, "advantage", rows),
                **{c: _tensor(batch, c, rows) for c in group_needs},
            }
            total = np.bincount(cell, minlength=size).reshape(n_buckets, 2)
            for r in group:
                counts[r] += total
            for i, s in enumerate(scales):
                masks = evaluate_all({r: (s * thresholds[r][0], s * thresholds[r][1]) for r in group}, **given)
                for r in group:
                    hit = cell[masks[r].numpy()]
                    blocked[r][i] += np.bincount(hit, minlength=size).reshape(n_buckets, 2)
    return _table(rules, scales, thresholds, counts, blocked, by_bucket, min_p, per_decade)


def _table(rules, scales, thresholds, counts, blocked, by_bucket, min_p, per_decade) -> pl.DataFrame:
    buckets = bucket_table(min_p, per_decade)
    records = []
    for r in rules:
        low, high = thresholds[r]
        for i, s in enumerate(scales):
            n, k = counts[r], blocked[r][i]
            if not by_bucket:
                n, k = n.sum(0, keepdims=True), k.sum(0, keepdims=True)
            for b in range(n.shape[0]):
                records.append(
                    {
                        "rule": r,
                        "scale": s,
                        "low": s * low,
                        "high": s * high,
                        "bucket": b,
                        "count": int(n[b].sum()),
                        "blocked": int(k[b].sum()),
                        "count_pos": int(n[b, 1]),
                        "blocked_pos": int(k[b, 1]),
                        "count_neg": int(n[b, 0]),
                        "blocked_neg": int(k[b, 0]),
                    }
                )
    schema = {
        "rule": pl.String,
        "scale": pl.Float64,
        "low": pl.Float64,
        "high": pl.Float64,
        "bucket": pl.Int32,
        **{c: pl.Int64 for c in ("count", "blocked", "count_pos", "blocked_pos", "count_neg", "blocked_neg")},
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
