"""What `certify` compares, read from a run: each token's log μ and log π_old once, after the
checks a certificate needs (bad input is a `CertifyInputError`, one line naming what to record).

A certificate claims μ = π_old, so it needs both from the same weights:
- log μ (`mu_logp`), the engine's;
- log π_old (`old_logp`), the trainer's recomputation before any update of the step. Where it
  was not recorded, π at the step's first update (`pi_logp` of update 0) stands in: the same
  weights, before any optimizer step (what the doctor does too), for the tokens recorded there;
- fresh rollouts. With config `rollout_lag` k > 0 μ comes from weights k steps older than π_old's,
  and μ = π_old cannot hold: refused. Where the per-token `staleness` is recorded, the tokens at
  staleness 0 are compared and the others left out (said in the notes).

A token is recorded once per update (and epoch) with the same μ and π_old: the copies are
compared once. A sampled run (`Keep`) holds the kept tokens only: they are compared, and the
notes say so.

Precision: the columns are float32, but a log-probability made in bf16 (8 significant bits)
keeps the low 16 bits of its float32 pattern at 0. `column_precision` reads that from the first
PRECISION_ROWS tokens; a comparison is then only as fine as the coarser column (`compare`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from trustlens.analysis.buckets import collect

KEYS = ("step", "rank", "sample", "pos")  # one token of a run
PRECISION_ROWS = 100_000  # tokens read to tell a column's precision
MIN_EVIDENCE = 16  # values that are neither 0 nor −inf needed to call a column bf16
FLOAT32, BF16 = "float32", "bf16"
MANTISSA_BITS = {FLOAT32: 24, BF16: 8}  # significant bits, the implicit one included
REFERENCES = ("old_logp", "pi_logp at update 0")  # what log π_old is read from


class CertifyInputError(ValueError):
    """The run cannot be certified as it was recorded: the message says what to record."""


@dataclass(frozen=True)
class Compared:
    """The tokens a certificate is about."""

    name: str  # the run's name (for messages)
    tokens: pl.LazyFrame  # one row per token: KEYS, token (text), mu, old (Float32), update
    first_update: pl.LazyFrame  # rows of update 0 (π has π_old's weights there): pi, mu, old and top-K columns
    reference: str  # where log π_old comes from (REFERENCES)
    precision: dict[str, str]  # "mu" and "old" -> FLOAT32 or BF16
    sampled: bool  # the run kept a sample of its tokens (Keep)
    config: dict[str, Any]  # run.json "config" ({} when absent)
    notes: list[str] = field(default_factory=list)  # what the comparison covers, in words

    @property
    def precision_of_comparison(self) -> str:
        """The coarser of the two columns' precisions."""
        return min(self.precision.values(), key=lambda p: MANTISSA_BITS[p])


def column_precision(values: np.ndarray) -> str:
    """BF16 when every value of `values` (float32) other than 0 and −inf has the low 16 bits of
    its pattern at 0 and there are at least MIN_EVIDENCE of them, else FLOAT32."""
    v = values[np.isfinite(values) & (values != 0)].astype(np.float32)
    if len(v) < MIN_EVIDENCE:
        return FLOAT32
    return BF16 if bool(((v.view(np.uint32) & 0xFFFF) == 0).all()) else FLOAT32


def _non_null(frame: pl.LazyFrame, col: str) -> int:
    return int(collect(frame.select(pl.col(col).is_not_null().sum())).item())


def compared_tokens(run: Any) -> Compared:
    """The `Compared` of a Run or a token LazyFrame (empty manifest); CertifyInputError when μ
    is missing, μ is stale (rollout_lag > 0, or no token at staleness 0) or nothing is left."""
    if isinstance(run, pl.LazyFrame):
        tokens, manifest, name, sampled = run, {}, "tokens", False
    else:
        tokens, manifest, name, sampled = run.tokens, dict(run.manifest or {}), run.name, bool(run.sampled)
    given = manifest.get("config")
    config: dict[str, Any] = given if isinstance(given, dict) else {}
    names = tokens.collect_schema().names()
    for col, value in (("old_logp", pl.lit(None, pl.Float32)), ("rank", pl.lit(0, pl.Int16))):
        if col not in names:
            tokens = tokens.with_columns(value.alias(col))
    if "token" not in names:
        tokens = tokens.with_columns(pl.lit(None, pl.String).alias("token"))
    if "mu_logp" not in names or manifest.get("anchor") == "old" or _non_null(tokens, "mu_logp") == 0:
        raise CertifyInputError(
            f"{name}: no log μ recorded (mu_logp is null): a certificate compares the rollout engine's log-probs "
            "with the trainer's; pass mu_logp= (the engine's log-prob of each sampled token) to record"
        )
    lag = config.get("rollout_lag")
    if isinstance(lag, int) and not isinstance(lag, bool) and lag > 0:
        steps = f"{lag} step{'s' if lag > 1 else ''}"
        raise CertifyInputError(
            f"{name}: rollout_lag {lag}: μ comes from weights up to {steps} older than π_old's, so μ = π_old "
            "cannot be certified; record a synchronous run (rollout_lag 0), or record staleness= per token so "
            "that the tokens sampled with π_old's weights (staleness 0) can be certified"
        )
    notes = []
    if "staleness" in names and _non_null(tokens, "staleness"):
        stale = _non_null(tokens.filter(pl.col("staleness") > 0), "staleness")
        tokens = tokens.filter(pl.col("staleness") == 0)
        if stale:
            notes.append(f"{stale} token rows sampled with older weights (staleness > 0) left out")
    reference = REFERENCES[0]
    if _non_null(tokens, "old_logp") == 0:
        reference = REFERENCES[1]
        at_first = tokens.filter(pl.col("update") == 0).select(KEYS)
        later = _non_null(
            tokens.select(*KEYS, "pi_logp").unique(list(KEYS)).join(at_first, on=KEYS, how="anti"), "pi_logp"
        )
        notes.append(
            "π_old not recorded (old_logp is null): compared with π at each step's first update (the same weights, "
            "before any optimizer step), on the tokens recorded there; record old_logp= to compare every token"
            + (f" ({later} tokens recorded only at later updates left out)" if later else "")
        )
    old = pl.col("old_logp") if reference == REFERENCES[0] else pl.when(pl.col("update") == 0).then(pl.col("pi_logp"))
    rows = tokens.with_columns(
        pl.col("mu_logp").cast(pl.Float32).alias("mu"),
        old.cast(pl.Float32).alias("old"),
        pl.col("token").cast(pl.String),
    ).filter(pl.col("mu").is_not_null() & pl.col("old").is_not_null())
    distinct = rows.select(*KEYS, "update", "token", "mu", "old").unique(list(KEYS), keep="any")
    head = collect(distinct.select("mu", "old").head(PRECISION_ROWS))
    if head.height == 0:
        raise CertifyInputError(f"{name}: no token has both log μ and log π_old: nothing to certify")
    precision = {c: column_precision(head[c].to_numpy()) for c in ("mu", "old")}
    if sampled:
        rows_all = collect(run.aggregates.select(pl.col("tokens").sum())).item()
        notes.append(
            "a sampled run (Keep): the kept tokens are compared; the verdict holds for them, not for the tokens "
            f"the sample dropped (the aggregates count {rows_all:,} token rows over every update)"
        )
    top = [c for c in ("topk_tv", "topk_kl", "mu_topk_mass", "pi_topk_mass") if c in names]
    first_update = rows.filter(pl.col("update") == 0).select(
        *KEYS, pl.col("pi_logp").cast(pl.Float32).alias("pi"), "mu", "old", *top
    )
    return Compared(name, distinct, first_update, reference, precision, sampled, config, notes)


__all__ = [
    "BF16",
    "FLOAT32",
    "KEYS",
    "MANTISSA_BITS",
    "CertifyInputError",
    "Compared",
    "column_precision",
    "compared_tokens",
]
