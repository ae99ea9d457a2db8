"""Record-time sampling (`Keep`) and the exact aggregates table of a run.

A run recorded with `TokenRecorder(..., keep=Keep(rate=0.01))` stores every token that matters
and a seeded random share of the rest, each with its sampling weight, and beside them the
`aggregates` table, written from **all** tokens before any is dropped: one row per `record`
call (a step, update and rank), summed per (step, update, rank) when read. Overview numbers
(block rates of every evaluated rule, mismatch means) come from the aggregates exactly;
token-level views use the kept rows, weighted by `weight` where they estimate a count or a rate.

Kept because they matter (weight 1):
    blocked by the run's active rule (`TokenRecorder(active_rule=...)`) or by a rule of
    `Keep.rules` (the user's choice), μ(a_t) < `low_mu`, a non-finite value (e.g. topk_kl =
    +inf), and the `top_share` of the call's tokens with the largest divergence max(binary_tv,
    topk_tv) (a per-call quantile: decidable without future data).
Kept at random (weight 1/rate): each other token with probability `rate`, decided by a hash of
    (seed, step, update, rank, sample, position) — reproducible, and independent of how the
    tokens were batched. Tokens only the other rules block (counterfactual rules, and sequence
    and batch rules, which block whole responses or shares of a call) are among them: their
    blocks are counted exactly in the aggregates (k_<rule>_<sign>), and a weighted count over
    the kept rows is an unbiased estimate of them: E[Σ_kept w·1{blocked}] = Σ 1{blocked}, as
    each token's expected weight is 1 (1 when it matters; 1/rate with probability rate else).
    A sequence rule stays exactly decidable on every kept row: each row carries its response's
    statistics (trustlens.record.sequence_stats), computed from all its tokens before sampling.

Aggregate columns (counts are int64, sums float64; "pairs" are tokens with μ and π_old, −inf included):
    tokens, tokens_pos, tokens_neg, tokens_zero       rows by advantage sign
    k_<rule>_<sign>                                   A > 0 / A < 0 tokens the rule blocks; null
                                                      when the call did not evaluate the rule
                                                      (a rule is evaluated on all of a call's
                                                      tokens or on none)
    pairs, sum_k1, sum_k3, sum_prob_diff, max_prob_diff, sum_mu, sum_old, sum_mu2, sum_old2,
    sum_mu_old, sum_rho2                              the token-level mismatch sums: k1 = log μ −
                                                      log π_old, k3 = ρ − 1 − log ρ (ρ = π_old/μ),
                                                      |π_old − μ|, moments for the Pearson
                                                      correlation, ρ² with log ρ clamped to ±20
    topk_n, sum_topk_tv, max_topk_tv, sum_topk_kl     the token columns topk_tv, topk_kl: μ vs π,
                                                      the policy being updated (sum_topk_kl may be
                                                      +inf); stored, no per-step metric: the
                                                      metrics topk_tv_mean, topk_tv_max and
                                                      topk_kl_mean are μ vs π_old, as a trainer
                                                      logs them (docs/metrics.md)
    entropy_n, sum_entropy                            tokens with a recorded entropy of π and its
                                                      sum (nats); absent in runs recorded before
                                                      2026-11-26 (their entropy means are weighted
                                                      estimates from the kept rows)
    mu_decade_0 … mu_decade_6                         tokens with μ in [10⁻¹, 1], [10⁻², 10⁻¹), …,
                                                      [10⁻⁶, 10⁻⁵), below 10⁻⁶
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import polars as pl
import pyarrow as pa

from trustlens.metrics import SIGNS
from trustlens.rules import Rule, get_rule

LOG_RATIO_BOUND = 20.0  # |log ρ| bound before exp in ρ² (as verl's chi² metrics)
MU_DECADES = 7
COUNT_BASE = ("tokens", "tokens_pos", "tokens_neg", "tokens_zero", "pairs", "topk_n", "entropy_n")
SUMS = ("sum_k1", "sum_k3", "sum_prob_diff", "sum_mu", "sum_old", "sum_mu2", "sum_old2", "sum_mu_old", "sum_rho2")
MAXES = ("max_prob_diff", "max_topk_tv")
TOPK_SUMS = ("sum_topk_tv", "sum_topk_kl")
ENTROPY_SUMS = ("sum_entropy",)
SIGNS_SUFFIXES = tuple(f"_{s}" for s in SIGNS)  # column suffixes of the per-rule counts


@dataclass(frozen=True)
class Keep:
    """Which token rows a sampled recording keeps (module docstring)."""

    rate: float = 0.01  # probability of keeping a token that does not matter; its weight is 1/rate
    seed: int = 0  # seeds the random share (with step, update, rank, sample, position)
    low_mu: float = 0.1  # tokens with μ(a_t) (π_old's without μ) below this always kept (the rare tokens)
    top_share: float = 0.01  # share of each record call's tokens with the largest divergence, always kept
    # rules (names, or Rules) whose blocked tokens are always kept, beside the run's active rule;
    # the other rules' blocked tokens are sampled at `rate` (their counts are exact in the
    # aggregates). Stored as a tuple of distinct names
    rules: Sequence[str] = ()

    def __post_init__(self) -> None:
        for name, low, high in (("rate", 0.0, 1.0), ("low_mu", 0.0, 1.0), ("top_share", 0.0, 1.0)):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not low < value <= high or math.isnan(value):
                raise ValueError(f"Keep.{name} must be in ({low:g}, {high:g}], got {value!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"Keep.seed must be an integer ≥ 0, got {self.seed!r}")
        object.__setattr__(self, "rules", _rule_names(self.rules))


def _rule_names(rules: object) -> tuple[str, ...]:
    """`Keep.rules` as a tuple of distinct names, in the order given; ValueError for anything but
    a list of registered rule names or `Rule`s."""
    if isinstance(rules, (str, Rule)) or not isinstance(rules, (list, tuple)):
        raise ValueError(f"Keep.rules must be a list of rule names, e.g. ['ppo', 'rs_geo'], got {rules!r}")
    try:
        return tuple(dict.fromkeys(get_rule(rule).name for rule in rules))
    except KeyError as err:
        raise ValueError(f"Keep.rules: {err.args[0]}") from None


def check_kept_rules(keep: Keep | None, evaluated: list[str]) -> None:
    """ValueError naming the rules of `keep.rules` that a run evaluating `evaluated` does not
    evaluate: their blocked tokens could not be kept."""
    missing = [] if keep is None else [r for r in keep.rules if r not in evaluated]
    if missing:
        raise ValueError(
            f"Keep.rules {missing} are not among the rules the run evaluates {evaluated}: add them to rules= "
            "or leave them out of Keep(rules=...)"
        )


def aggregate_names(rules: list[str] | tuple[str, ...]) -> list[tuple[str, pa.DataType]]:
    """(column, type) of the aggregates table of a run evaluating `rules`, after step and update."""
    out = [(c, pa.int64()) for c in COUNT_BASE]
    out += [(f"k_{r}_{s}", pa.int64()) for r in rules for s in SIGNS]
    out += [(c, pa.float64()) for c in (*SUMS, *MAXES, *TOPK_SUMS, *ENTROPY_SUMS)]
    out += [(f"mu_decade_{i}", pa.int64()) for i in range(MU_DECADES)]
    return out


_DOCS = {
    "tokens": "token rows of the record call (all of them, kept or not)",
    "tokens_pos": "tokens with A > 0",
    "tokens_neg": "tokens with A < 0",
    "tokens_zero": "tokens with A = 0 (no gradient, never blocked)",
    "pairs": "tokens with log μ and log π_old, −inf included (the mismatch sums are over them)",
    "sum_k1": "Σ (log μ − log π_old), nats",
    "sum_k3": "Σ (ρ − 1 − log ρ), ρ = π_old/μ, nats",
    "sum_prob_diff": "Σ |π_old − μ|, probability",
    "max_prob_diff": "max |π_old − μ|, probability",
    "sum_mu": "Σ μ(a_t)",
    "sum_old": "Σ π_old(a_t)",
    "sum_mu2": "Σ μ(a_t)²",
    "sum_old2": "Σ π_old(a_t)²",
    "sum_mu_old": "Σ μ(a_t) π_old(a_t)",
    "sum_rho2": "Σ ρ², log ρ clamped to ±20",
    "topk_n": "tokens with a recorded top-K divergence of μ and π",
    "sum_topk_tv": "Σ topk_tv (μ vs π, not π_old), probability",
    "max_topk_tv": "max topk_tv (μ vs π, not π_old), probability",
    "sum_topk_kl": "Σ topk_kl (KL(μ ‖ π), not π_old), nats (+inf when one is)",
    "entropy_n": "tokens with a recorded entropy of π",
    "sum_entropy": "Σ entropy of π, nats",
}


def aggregate_doc(name: str) -> str | None:
    """The meaning of aggregate column `name`, or None when it is not one."""
    if name in _DOCS:
        return _DOCS[name]
    if name.startswith("mu_decade_") and name[10:].isdigit():
        i = int(name[10:])
        if i == 0:
            return "tokens with μ in [10^-1, 1]"
        return f"tokens with μ in [10^-{i + 1}, 10^-{i})" if i < MU_DECADES - 1 else f"tokens with μ below 10^-{i}"
    if name.startswith("k_") and name.endswith(SIGNS_SUFFIXES):
        rule, sign = name[2:].rsplit("_", 1)
        side = ">" if sign == "pos" else "<"
        return f"A {side} 0 tokens rule {rule!r} blocks (null: the rule was not evaluated)"
    return None


def anchor_logp(floats: dict) -> np.ndarray:
    """The log-probabilities of the anchor policy a batch's tokens are bucketed and kept by: μ,
    else π_old (the anchor of a run without μ, as in trustlens.analysis.tokens.anchor_column),
    else π."""
    return next(floats[k] for k in ("mu_logp", "old_logp", "pi_logp") if floats.get(k) is not None)


def _mismatch_sums(lm: np.ndarray, lo: np.ndarray) -> dict[str, object]:
    """The token-level mismatch sums over every token of log μ `lm` and log π_old `lo` (float64):
    a log-probability of −inf (probability 0) is a value, as in the rows
    (trustlens.analysis.mismatch), and may make a sum infinite, or NaN (−inf − (−inf), ∞ − ∞) as
    there."""
    with np.errstate(invalid="ignore"):
        mu, old = np.exp(lm), np.exp(lo)
        log_rho = lo - lm
        diff = np.abs(old - mu)
        return {
            "pairs": len(lm),
            "sum_k1": float(-log_rho.sum()),
            "sum_k3": float((np.exp(log_rho) - 1 - log_rho).sum()),
            "sum_prob_diff": float(diff.sum()),
            "max_prob_diff": float(diff.max()) if diff.size else None,
            "sum_mu": float(mu.sum()),
            "sum_old": float(old.sum()),
            "sum_mu2": float((mu * mu).sum()),
            "sum_old2": float((old * old).sum()),
            "sum_mu_old": float((mu * old).sum()),
            "sum_rho2": float(np.exp(2 * np.clip(log_rho, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)).sum()),
        }


def aggregate_row(batch, rules: list[str]) -> dict[str, object]:
    """The aggregates of the rows of one TokenBatch (all of them: before sampling)."""
    f = batch.floats
    adv = f["advantage"]
    pos, neg = adv > 0, adv < 0
    row: dict[str, object] = {
        "tokens": len(adv),
        "tokens_pos": int(pos.sum()),
        "tokens_neg": int(neg.sum()),
        "tokens_zero": int((adv == 0).sum()),
    }
    for r in rules:
        decided = batch.blocked.get(r)
        for sign, side in (("pos", pos), ("neg", neg)):
            row[f"k_{r}_{sign}"] = int((decided & side).sum()) if decided is not None else None
    mu_logp, old_logp = f.get("mu_logp"), f.get("old_logp")
    if mu_logp is not None and old_logp is not None:
        row |= _mismatch_sums(mu_logp.astype(np.float64), old_logp.astype(np.float64))
    else:
        row |= {"pairs": 0, **dict.fromkeys(SUMS, 0.0), "max_prob_diff": None}
    tv, kl = f.get("topk_tv"), f.get("topk_kl")
    if tv is not None and kl is not None:
        present = ~np.isnan(tv)
        row |= {
            "topk_n": int(present.sum()),
            "sum_topk_tv": float(tv[present].astype(np.float64).sum()),
            "max_topk_tv": float(tv[present].max()) if present.any() else None,
            "sum_topk_kl": float(kl[present].astype(np.float64).sum()),
        }
    else:
        row |= {"topk_n": 0, "sum_topk_tv": 0.0, "max_topk_tv": None, "sum_topk_kl": 0.0}
    entropy = f.get("entropy")
    recorded = entropy[np.isfinite(entropy)] if entropy is not None else np.zeros(0)
    row |= {"entropy_n": int(recorded.size), "sum_entropy": float(recorded.astype(np.float64).sum())}
    anchor = anchor_logp(f)
    # decade k holds μ in [10^-(k+1), 10^-k): k = -floor(log10 μ) - 1, as the buckets of
    # trustlens.analysis.buckets cut; μ = 1 joins decade 0, μ = 0 the last
    decade = np.clip(-np.floor(anchor.astype(np.float64) / math.log(10)) - 1, 0, MU_DECADES - 1)
    counts = np.bincount(decade[np.isfinite(decade)].astype(np.int64), minlength=MU_DECADES)
    row |= {f"mu_decade_{i}": int(counts[i]) for i in range(MU_DECADES)}
    return row


def aggregates_batch(row: dict[str, object], step: int, update: int, schema: pa.Schema) -> pa.RecordBatch:
    """One aggregate row (`aggregate_row`) as a RecordBatch of the table's `schema`."""
    return pa.RecordBatch.from_pylist([{"step": step, "update": update, **row}], schema=schema)


def keep_rows(batch, keep: Keep | None, rules: list[str], rank: int, active: str | None = None):
    """The TokenBatch to write for `batch` under `keep` (None: `batch` itself, no aggregates):
    the kept rows with their weights, carrying the aggregates of all rows. `active`: the run's
    active rule (None: none named), whose blocked tokens are kept as those of `keep.rules` are."""
    if keep is None:
        return batch
    kept, weight = keep_mask(batch, keep, rank, active)
    rows = sampled(batch, kept, weight)
    # ratio and the binary divergences follow from the log-probs: the reader computes them
    floats = {k: None if k in ("ratio", "binary_tv", "binary_kl") else v for k, v in rows.floats.items()}
    return replace(rows, floats=floats, aggregates=aggregate_row(batch, rules))


def keep_mask(batch, keep: Keep, rank: int, active: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(kept (N,) bool, weight (N,) float32) of a TokenBatch's rows under `keep`, `active` the
    run's active rule (module docstring)."""
    f = batch.floats
    n = len(batch)
    matters = np.zeros(n, bool)
    for rule in dict.fromkeys((active, *keep.rules)):
        decided = None if rule is None else batch.blocked.get(rule)
        if decided is not None:
            matters |= decided
    anchor = anchor_logp(f)
    matters |= anchor < math.log(keep.low_mu)
    for values in f.values():
        if values is not None:
            matters |= np.isinf(values)  # non-finite (NaN means "not recorded")
    divergence = np.fmax(f["binary_tv"], f["topk_tv"]) if f.get("topk_tv") is not None else f["binary_tv"]
    if n and divergence is not None:
        finite = divergence[np.isfinite(divergence)]
        if finite.size:
            threshold = np.quantile(finite, 1 - keep.top_share)
            matters |= (divergence >= threshold) & (divergence > 0)
    chance = _uniform(keep.seed, batch.step, batch.update, rank, batch.sample, batch.pos)
    random = ~matters & (chance < keep.rate)
    weight = np.where(matters, 1.0, 1.0 / keep.rate).astype(np.float32)
    return matters | random, weight


def sampled(batch, kept: np.ndarray, weight: np.ndarray):
    """The TokenBatch of the kept rows, with their weights."""
    floats = {k: None if v is None else v[kept] for k, v in batch.floats.items()}
    floats["weight"] = weight[kept]
    return replace(
        batch,
        sample=batch.sample[kept],
        group=batch.group[kept],
        pos=batch.pos[kept],
        token_id=batch.token_id[kept],
        floats=floats,
        blocked={k: None if v is None else v[kept] for k, v in batch.blocked.items()},
        routes=None if batch.routes is None else batch.routes.take(kept),
    )


_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a well-spread 64-bit hash of `x` (uint64, wraps)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _uniform(seed: int, step: int, update: int, rank: int, sample: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """A uniform [0, 1) number per (seed, step, update, rank, sample, position)."""
    with np.errstate(over="ignore"):
        key = _mix(np.full(1, seed * 1_000_003 + step, np.uint64))
        key = _mix(key ^ np.uint64(update * 65_537 + rank))
        h = _mix(key ^ sample.astype(np.uint64))
        h = _mix(h ^ pos.astype(np.uint64))
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def step_aggregates(aggregates) -> pl.DataFrame:
    """The aggregates table (a polars LazyFrame or DataFrame, all ranks) summed per step, sorted
    by step: its count and sum columns summed, max_ columns maxed, and per rule the tokens it
    decided: n_<rule>_<sign> (the sign's tokens of the calls that evaluated it), n_<rule> and
    k_<rule> (both signs: A ≠ 0)."""
    frame = aggregates.lazy()
    names = frame.collect_schema().names()
    rules = sorted({c[2:-4] for c in names if c.startswith("k_") and c.endswith(SIGNS_SUFFIXES)})
    decided = [
        pl.when(pl.col(f"k_{r}_{s}").is_not_null()).then(pl.col(f"tokens_{s}")).otherwise(0).alias(f"n_{r}_{s}")
        for r in rules
        for s in SIGNS
    ]
    maxes = [c for c in names if c.startswith("max_")]
    sums = [c for c in names if c not in ("step", "update", "rank", *maxes)]
    sums += [f"n_{r}_{s}" for r in rules for s in SIGNS]
    steps = (
        frame.with_columns(decided)
        .group_by("step")
        .agg(*(pl.col(c).sum() for c in sums), *(pl.col(c).max() for c in maxes))
        .with_columns(
            *(pl.sum_horizontal(f"n_{r}_{s}" for s in SIGNS).alias(f"n_{r}") for r in rules),
            *(pl.sum_horizontal(f"k_{r}_{s}" for s in SIGNS).alias(f"k_{r}") for r in rules),
        )
        .sort("step")
    )
    return steps.collect()


def mismatch_stats(steps: pl.DataFrame) -> pl.DataFrame:
    """step and the token-level mismatch of μ vs π_old from `step_aggregates` rows, under the
    names of trustlens.metrics: mismatch_kl, k3_kl, chi2_token, prob_diff_mean, prob_diff_max,
    prob_pearson over the `pairs` (null where a step has none). Not the top-K ones: the
    aggregates' topk_* columns are μ vs π, and topk_tv_mean, topk_tv_max, topk_kl_mean name μ vs
    π_old (only a trainer with π_old's logits has it)."""
    pairs = pl.col("pairs")

    def mean(c: str) -> pl.Expr:
        return pl.when(pairs > 0).then(pl.col(c) / pairs)

    var_mu = mean("sum_mu2") - mean("sum_mu") ** 2
    var_old = mean("sum_old2") - mean("sum_old") ** 2
    cov = mean("sum_mu_old") - mean("sum_mu") * mean("sum_old")
    return steps.select(
        "step",
        mean("sum_k1").alias("mismatch_kl"),
        mean("sum_k3").alias("k3_kl"),
        (mean("sum_rho2") - 1).alias("chi2_token"),
        mean("sum_prob_diff").alias("prob_diff_mean"),
        pl.when(pairs > 0).then(pl.col("max_prob_diff")).alias("prob_diff_max"),
        pl.when((var_mu > 0) & (var_old > 0)).then(cov / (var_mu * var_old).sqrt()).alias("prob_pearson"),
    )


def per_step_scalars(aggregates) -> dict[int, dict[str, float]]:
    """Per-step scalars from an aggregates table (a polars LazyFrame or DataFrame, all ranks):
    {step: {name: value}} under the names of trustlens.metrics — blocked/<rule>/<sign> over A ≠ 0
    tokens, zero_adv_frac, and the token-level mismatch of `mismatch_stats`: the names and values
    `trustlens.export.token_scalars` gives on every token of the run. Exact for all tokens,
    however few rows were kept. Sequence-level metrics (log_ppl_*, chi2_seq) need whole
    responses, and the top-K mismatch (topk_*) π_old's logits: neither is among them."""
    steps = step_aggregates(aggregates)
    rules = [c[2:] for c in steps.columns if c.startswith("n_") and not c.endswith(SIGNS_SUFFIXES)]
    stats = {row.pop("step"): row for row in mismatch_stats(steps).iter_rows(named=True)}
    out: dict[int, dict[str, float]] = {}
    for row in steps.iter_rows(named=True):
        values: dict[str, float] = {}
        for rule in rules:
            for sign in SIGNS:
                n = row[f"n_{rule}_{sign}"]
                if n:
                    values[f"blocked/{rule}/{sign}"] = row[f"k_{rule}_{sign}"] / n
        if row["tokens"]:
            values["zero_adv_frac"] = row["tokens_zero"] / row["tokens"]
        values |= {k: v for k, v in stats[row["step"]].items() if v is not None}
        out[int(row["step"])] = values
    return out
