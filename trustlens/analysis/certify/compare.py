"""The comparisons of a certificate, over the `Compared` tokens of a run.

Sampled tokens. log μ and log π_old of each token are equal when they are the same float32
value: the same bits (+0 and −0 aside). Where a column was recorded in bf16, the bits below its
8 significant bits are not known: π_old and μ are then equal "within the recorded precision"
when they differ by at most half a bf16 step of the bf16 value v, 2^(⌊log2 |v|⌋ − 8) (π_old
rounds to μ). Where they differ:
- the first differing tokens (step, sample, position, text, both values, |Δ| and float32 ulps);
- the differing share by position (`POSITIONS`); position 0 is the token the engine's prefill
  of the prompt predicts, the later ones decode steps (an engine with a KV cache);
- by batch composition, where the run says it: each (step, rank)'s samples in sample-id order
  are the rows of its batch (the built-in trainer's and the default ids number them so), and
  the decode batch of a position is the number of the step's samples with a token there (the
  sequences still generating). Not in a sampled run, whose rows are a sample.

Distribution at K. The run does not store μ's top-K ids and log-probs: `record` reduces them,
with π's logits, to topk_tv, topk_kl, mu_topk_mass and pi_topk_mass (π vs μ over μ's top-K ids
S and the rest). At update 0 π has π_old's weights, so there TV = 0 would say that π_old's
probabilities equal μ's on S and on the rest (the masses equal). μ's top-K log-probs are float32
and record computes π's in float64 from the logits, so identical distributions still show the
float32 rounding of the K log-probs: equal at K means TV ≤ TOPK_TOLERANCE on every token of
update 0 (the fp32_exact engine's run: ≤ 6e-8; a bf16 engine's: ~1e-2). That π's own top-K ids
are S is not recorded, so not checked.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl

from trustlens.analysis.buckets import collect
from trustlens.analysis.certify.tokens import BF16, FLOAT32, MANTISSA_BITS, Compared

POSITIONS = ((0, 1), (1, 4), (4, 16), (16, 64), (64, math.inf))  # [lo, hi) position buckets
EXAMPLES = 5  # the first differing tokens listed
TOPK_TOLERANCE = 1e-6  # largest top-K TV (probability mass) that float32 rounding of μ's top-K explains


def equal_expr(precision: dict[str, str]) -> pl.Expr:
    """Per token: log μ equals log π_old at the recorded precision (module docstring)."""
    mu, old = pl.col("mu"), pl.col("old")
    same = mu == old
    if FLOAT32 in precision.values() and BF16 not in precision.values():
        return same
    coarse = mu if precision["mu"] == BF16 else old  # a bf16 column's value sets the step
    half_step = pl.lit(2.0).pow(coarse.cast(pl.Float64).abs().log(2).floor() - MANTISSA_BITS[BF16])
    gap = (mu.cast(pl.Float64) - old.cast(pl.Float64)).abs()
    return same | (gap <= half_step).fill_null(False)


def ulps(a: float, b: float) -> int | None:
    """How many float32 values lie between a and b (one apart: 1); None when one is not finite."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return None
    bits = np.array([a, b], dtype=np.float32).view(np.int32).astype(np.int64)
    ordered = np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)  # monotone in the value, ±0 together
    return int(abs(ordered[0] - ordered[1]))


def _position_bucket() -> pl.Expr:
    out = pl.lit(None, pl.Int32)
    for i, (lo, hi) in enumerate(POSITIONS):
        out = pl.when((pl.col("pos") >= lo) & (pl.col("pos") < hi)).then(pl.lit(i, pl.Int32)).otherwise(out)
    return out


def _shares(frame: pl.LazyFrame, by: pl.Expr, name: str) -> list[dict[str, Any]]:
    """[{name, compared, differing, share}] of `frame` (with `differs`) grouped by `by`."""
    table = collect(
        frame.group_by(by.alias(name))
        .agg(pl.len().alias("compared"), pl.col("differs").sum().alias("differing"))
        .sort(name)
    )
    return [{**row, "share": row["differing"] / row["compared"]} for row in table.iter_rows(named=True)]


def _ranges(values: list[int]) -> str:
    """Sorted integers as ranges: [0, 1, 2, 5] -> "0–2, 5"."""
    parts, start = [], None
    for i, v in enumerate(values):
        start = v if start is None else start
        if i + 1 == len(values) or values[i + 1] != v + 1:
            parts.append(str(v) if v == start else f"{start}–{v}")
            start = None
    return ", ".join(parts)


def concentrated(shares: list[dict[str, Any]], name: str) -> str | None:
    """The values of `name` that hold every differing token, as ranges, when they are not all
    of them (None: the differences are everywhere, or nowhere)."""
    hit = [r[name] for r in shares if r["differing"]]
    if not hit or len(hit) == len(shares):
        return None
    return _ranges(sorted(hit))


def sampled_tokens(c: Compared) -> dict[str, Any]:
    """The sampled-token comparison: compared, equal, share, max_abs_diff (nats), precision,
    first_differing, by_position, prefill / decode, and by_row / by_decode_batch / batch sizes
    (None in a sampled run)."""
    precision = c.precision_of_comparison
    frame = c.tokens.with_columns(
        (~equal_expr(c.precision)).alias("differs"),
        (pl.col("mu").cast(pl.Float64) - pl.col("old").cast(pl.Float64)).abs().alias("gap"),
    )
    head = collect(
        frame.select(
            pl.len().alias("compared"),
            pl.col("differs").sum().alias("differing"),
            pl.col("gap").fill_nan(math.inf).max().alias("max_abs_diff"),
            (pl.col("mu") == pl.col("old")).sum().alias("same_bits"),
        )
    ).row(0, named=True)
    first = collect(frame.filter(pl.col("differs")).sort("step", "sample", "pos").head(EXAMPLES))
    examples = [
        {
            "step": r["step"],
            "rank": r["rank"],
            "sample": r["sample"],
            "pos": r["pos"],
            "update": r["update"],
            "token": r["token"],
            "mu_logp": float(r["mu"]),
            "old_logp": float(r["old"]),
            "abs_diff": float(r["gap"]),
            "ulps": ulps(r["mu"], r["old"]),
        }
        for r in first.iter_rows(named=True)
    ]
    by_position = _shares(frame, _position_bucket(), "bucket")
    for row in by_position:
        lo, hi = POSITIONS[row.pop("bucket")]
        row["positions"] = f"{lo}" if hi == lo + 1 else (f"{lo}+" if math.isinf(hi) else f"{lo}–{hi - 1}")
    phase = {r["decode"]: r for r in _shares(frame, pl.col("pos") > 0, "decode")}
    out: dict[str, Any] = {
        "compared": head["compared"],
        "equal": head["compared"] - head["differing"],
        "same_bits": head["same_bits"],
        "share": (head["compared"] - head["differing"]) / head["compared"],
        "max_abs_diff": float(head["max_abs_diff"] or 0.0),
        "precision": precision,
        "first_differing": examples,
        "by_position": by_position,
        "prefill": {k: v for k, v in phase.get(False, {}).items() if k != "decode"} or None,
        "decode": {k: v for k, v in phase.get(True, {}).items() if k != "decode"} or None,
        "by_row": None,
        "by_decode_batch": None,
        "batch_sizes": None,
    }
    if not c.sampled:
        step = ["step", "rank"]
        frame = frame.with_columns(
            (pl.col("sample").rank("dense").over(step) - 1).cast(pl.Int64).alias("row"),
            pl.col("sample").n_unique().over(step).alias("batch"),
            pl.col("sample").n_unique().over([*step, "pos"]).alias("live"),
        )
        out["by_row"] = _shares(frame, pl.col("row"), "row")
        out["by_decode_batch"] = _shares(frame, pl.col("live"), "live")
        out["batch_sizes"] = sorted(collect(frame.select(pl.col("batch").unique()))["batch"].to_list())
    return out


def distribution(c: Compared) -> dict[str, Any] | None:
    """The top-K comparison at update 0 (module docstring): tokens, within (TV ≤ TOPK_TOLERANCE),
    max_topk_tv, max_topk_kl, max_mass_gap, pi_equals_old (share of update-0 tokens whose
    pi_logp is π_old's bits), k (config "topk" when given) and the tolerance; None when the run
    records no top-K."""
    names = c.first_update.collect_schema().names()
    if "topk_tv" not in names:
        return None
    rows = c.first_update.filter(pl.col("topk_tv").is_not_null())
    mass_gap = (
        (pl.col("mu_topk_mass").cast(pl.Float64) - pl.col("pi_topk_mass").cast(pl.Float64)).abs().max()
        if "mu_topk_mass" in names
        else pl.lit(None, pl.Float64)
    )
    kl = pl.col("topk_kl").max() if "topk_kl" in names else pl.lit(None, pl.Float64)
    r = collect(
        rows.select(
            pl.len().alias("tokens"),
            (pl.col("topk_tv") <= TOPK_TOLERANCE).sum().alias("within"),
            pl.col("topk_tv").max().cast(pl.Float64).alias("max_topk_tv"),
            kl.cast(pl.Float64).alias("max_topk_kl"),
            mass_gap.alias("max_mass_gap"),
            (pl.col("pi") == pl.col("old")).mean().alias("pi_equals_old"),
        )
    ).row(0, named=True)
    if not r["tokens"]:
        return None
    k = c.config.get("topk")
    return {**r, "k": k if isinstance(k, int) and not isinstance(k, bool) else None, "tolerance": TOPK_TOLERANCE}


__all__ = [
    "EXAMPLES",
    "POSITIONS",
    "TOPK_TOLERANCE",
    "concentrated",
    "distribution",
    "equal_expr",
    "sampled_tokens",
    "ulps",
]
