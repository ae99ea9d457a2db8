"""What every doctor check reads: the token pairs (log μ, log π_old) of a run, lazily, and what
run.json says about how μ was made.

A check works on `Inputs`: `pairs` is the run's token rows with both log μ and a reference
log-probability (`ref`: log π_old, or log π at update 0 where π_old was not recorded, which is
the same policy), `d` = log μ − ref in nats and `w` the row's sampling weight (1 in a run that
recorded every token). Nothing is collected here: each check aggregates `pairs` with polars'
streaming engine, so a check costs one or two scans of the columns it needs (inside
`buckets.in_memory()`, the live doctor's few steps, `pairs` is computed once for every check).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import polars as pl

from trustlens.analysis.buckets import collect, reused, row_weight, weighted
from trustlens.analysis.collapse.levels import model_kind
from trustlens.analysis.mismatch import mismatch_per_step, trainer_logp
from trustlens.run.manifest import LOGPROBS_MODES, PROCESSORS

# the shift check's join of neighbouring positions reads, on a run with more than MAX_ROWS μ–π_old
# pairs, the whole samples whose id hash falls in one of ⌈rows / MAX_ROWS⌉ buckets (a
# deterministic subsample: the same run gives the same finding)
MAX_ROWS = 2_000_000
EXAMPLES = 5  # example tokens per finding
MODEL_KINDS = ("dense", "moe")
ENTROPIES = ((0.0, 0.1), (0.1, 1.0), (1.0, math.inf))  # buckets of π's entropy, nats


@dataclass(frozen=True)
class Sampling:
    """How run.json says μ was produced (its "sampling" field; every field None when absent)."""

    temperature: float | None  # τ the engine sampled at
    top_p: float | None  # nucleus threshold (None or 1: none)
    top_k: int | None  # top-k truncation (None or ≤ 0: none)
    min_p: float | None  # min-p truncation (None or 0: none)
    logprobs: str | None  # "raw" (before the temperature), "tempered" (after it, before truncation), "processed"
    processors: tuple[str, ...] = ()  # active logit processors besides temperature and filters (PROCESSORS)

    @property
    def truncated(self) -> bool:
        """Whether the recorded settings truncate the sampling support."""
        return (
            (self.top_p is not None and self.top_p < 1)
            or (self.top_k is not None and self.top_k > 0)
            or (self.min_p is not None and self.min_p > 0)
        )


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def read_sampling(manifest: dict[str, Any]) -> Sampling:
    """The "sampling" field of run.json, read defensively (older runs lack it; a built-in run's
    config["temperature"] stands in for the temperature)."""
    given = manifest.get("sampling")
    given = given if isinstance(given, dict) else {}
    config = manifest.get("config")
    config = config if isinstance(config, dict) else {}
    temperature = _number(given.get("temperature"))
    if temperature is None:
        temperature = _number(config.get("temperature"))
    top_k = _number(given.get("top_k"))
    logprobs = given.get("logprobs")
    processors = given.get("processors")
    processors = processors if isinstance(processors, list) else []
    return Sampling(
        temperature=temperature,
        top_p=_number(given.get("top_p")),
        top_k=None if top_k is None else int(top_k),
        min_p=_number(given.get("min_p")),
        logprobs=logprobs if logprobs in LOGPROBS_MODES else None,
        processors=tuple(p for p in processors if p in PROCESSORS),
    )


@dataclass(frozen=True)
class Inputs:
    """A run as the checks see it."""

    name: str  # the run's name (for messages)
    manifest: dict[str, Any]  # run.json
    tokens: pl.LazyFrame  # every token row (all ranks)
    pairs: pl.LazyFrame  # rows with log μ and ref: the token columns plus ref, d, w
    sampling: Sampling  # run.json's "sampling"
    model_kind: str  # "dense" or "moe" (run.json's "model_kind"; dense when absent or another kind)
    weighted: bool  # the rows carry sampling weights (a run recorded with Keep)
    has_mu: bool  # μ was recorded
    run: Any  # the Run (None for a bare LazyFrame)

    @property
    def config(self) -> dict[str, Any]:
        """The run's training configuration (run.json "config"; {} when absent)."""
        config = self.manifest.get("config")
        return config if isinstance(config, dict) else {}

    def config_count(self, key: str) -> int | None:
        """The config's `key` when it is a positive integer (rollout_lag, minibatches, epochs), else None."""
        value = self.config.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    @functools.cached_property
    def per_step(self) -> pl.DataFrame:
        """`mismatch_per_step` of the run (exact from a sampled run's aggregates), read once for
        every check that needs it."""
        return mismatch_per_step(self.run if self.run is not None else self.tokens)

    @functools.cached_property
    def fresh(self) -> tuple[pl.LazyFrame, str | None]:
        """(the pairs sampled with π_old's weights, why μ is stale in words) when the run says μ
        may be an older policy than π_old (whose mismatch is then the staleness, not the
        engine's); (every pair, None) when nothing says so. Where the pairs hold the per-token
        `staleness` column (weight updates between the engine's weights and π_old's), the tokens
        at 0. Else, with config `rollout_lag` k > 0 (the built-in trainer, whose engine serves the
        starting weights until k syncs have happened: step t's rollouts are min(t, k) steps
        stale), the tokens of step 0. Read once for every check that needs it."""
        names = self.pairs.collect_schema().names()
        if "staleness" in names and collect(self.pairs.select(pl.col("staleness").is_not_null().any())).item():
            return self.pairs.filter(pl.col("staleness") == 0), "the per-token staleness column"
        lag = self.config_count("rollout_lag")
        if lag is not None:
            return self.pairs.filter(pl.col("step") == 0), f"rollout_lag {lag}: μ is up to {lag} steps stale"
        return self.pairs, None

    def subsample(self, frame: pl.LazyFrame) -> pl.LazyFrame:
        """`frame` limited to about MAX_ROWS rows of whole samples (all of them in a smaller
        run): the samples whose id hash falls in the first of ⌈rows / MAX_ROWS⌉ buckets."""
        rows = collect(self.pairs.select(pl.len())).item()
        if rows <= MAX_ROWS:
            return frame
        share = math.ceil(rows / MAX_ROWS)
        return frame.filter(pl.col("sample").hash(seed=0) % share == 0)


def inputs_of(run: Any) -> Inputs:
    """The `Inputs` of a Run (or of a token LazyFrame, with an empty manifest)."""
    if isinstance(run, pl.LazyFrame):
        tokens, manifest, name, the_run = run, {}, "tokens", None
    else:
        tokens, manifest, name, the_run = run.tokens, dict(run.manifest or {}), run.name, run
    names = tokens.collect_schema().names()
    has_mu = "mu_logp" in names and (manifest.get("anchor") != "old")
    is_weighted = weighted(tokens)
    defaults = {"old_logp": pl.lit(None, pl.Float32), "rank": pl.lit(0, pl.Int16), "update": pl.lit(0, pl.Int16)}
    tokens = tokens.with_columns(value.alias(name) for name, value in defaults.items() if name not in names)
    w = row_weight() if is_weighted else pl.lit(1.0)
    ref = trainer_logp()
    pairs = (
        tokens.filter(pl.col("mu_logp").is_not_null() & ref.is_not_null())
        .with_columns(ref.alias("ref"), pl.col("mu_logp").cast(pl.Float64).alias("mu"), w.alias("w"))
        .with_columns((pl.col("mu") - pl.col("ref")).alias("d"))
        if has_mu
        else tokens.head(0).with_columns(
            pl.lit(None, pl.Float64).alias("ref"),
            pl.lit(None, pl.Float64).alias("mu"),
            pl.lit(None, pl.Float64).alias("w"),
            pl.lit(None, pl.Float64).alias("d"),
        )
    )
    kind = model_kind(the_run)
    return Inputs(
        name=name,
        manifest=manifest,
        tokens=tokens,
        pairs=reused(pairs),
        sampling=read_sampling(manifest),
        model_kind=kind if kind in MODEL_KINDS else "dense",
        weighted=is_weighted,
        has_mu=has_mu,
        run=the_run,
    )


def bucket_of(col: str, edges: tuple[tuple[float, float], ...]) -> pl.Expr:
    """The index (Int32) of the bucket [lo, hi) of `edges` that holds `col`; null outside them."""
    x = pl.col(col)
    out = pl.lit(None, pl.Int32)
    for i, (lo, hi) in enumerate(reversed(edges)):
        out = pl.when((x >= lo) & (x < hi)).then(pl.lit(len(edges) - 1 - i, pl.Int32)).otherwise(out)
    return out


def fresh_note(stale: str | None) -> str:
    """The words a check adds to its summary when it judged only the fresh tokens (`Inputs.fresh`'s
    reason `stale`; "" when μ is not stale)."""
    return f" on the tokens sampled with π_old's weights ({stale})" if stale else ""


def examples(frame: pl.LazyFrame, order: pl.Expr, n: int = EXAMPLES) -> list[dict[str, Any]]:
    """Up to `n` example tokens of `frame` (largest `order` first): step, update, sample, pos,
    token_id, token text (untrusted), mu, old (probabilities) — what the dashboard links into
    the token inspector by."""
    names = frame.collect_schema().names()
    token = pl.col("token").cast(pl.String) if "token" in names else pl.lit(None, pl.String)
    rows = collect(
        frame.select(
            pl.col("step", "update", "sample", "pos", "token_id"),
            token.alias("token"),
            pl.col("mu").exp().alias("mu"),
            pl.col("ref").exp().alias("old"),
            order.alias("_order"),
        )
        .filter(pl.col("_order").is_not_null())
        .top_k(n, by="_order")
        .sort("_order", descending=True)
    )
    return [{k: v for k, v in row.items() if k != "_order"} for row in rows.iter_rows(named=True)]


__all__ = [
    "ENTROPIES",
    "EXAMPLES",
    "MAX_ROWS",
    "Inputs",
    "Sampling",
    "bucket_of",
    "examples",
    "fresh_note",
    "inputs_of",
    "read_sampling",
]
