"""Checks of how μ was sampled: the temperature (1a) and a truncated support (1b).

Both read d = log μ(a_t) − log π_old(a_t) (nats) over the sampled tokens. The run format keeps
neither π's logits nor μ's top-K (only divergences derived from them), so both checks use the
token-level forms of the issue: how d depends on log μ and on π's entropy.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from trustlens.analysis.buckets import collect
from trustlens.analysis.diagnosis.finding import Finding, verdict_of
from trustlens.analysis.diagnosis.inputs import ENTROPIES, Inputs, bucket_of, examples

# temperature: |r − 1| at which the check warns / finds a problem (r = τ_μ / τ_π, see below)
TEMPERATURE_WARNING = 0.15
TEMPERATURE_PROBLEM = 0.3
MIN_TOKENS = 50  # fewer uncertain tokens than this: the checks cannot tell
# a token is "uncertain" when π_old(a_t) < UNCERTAIN: only there can a bias of d show
UNCERTAIN = 0.99
# truncation: share of uncertain tokens with μ > π_old, and their mean d (nats)
TRUNCATION_SHARE_WARNING = 0.75
TRUNCATION_SHARE_PROBLEM = 0.9
TRUNCATION_BIAS_WARNING = 0.01
TRUNCATION_BIAS_PROBLEM = 0.02


def _uncertain() -> pl.Expr:
    return pl.col("ref") < math.log(UNCERTAIN)


def temperature_ratio(pairs: pl.LazyFrame) -> tuple[float | None, int]:
    """(r, n): the temperature of μ relative to π_old's, r = τ_μ / τ_π, and the number of
    uncertain tokens it rests on (None below MIN_TOKENS or without spread in log μ).

    If μ is at temperature τ_μ and π_old at τ_π over the same logits z, then
    log π_old(a) = (τ_μ/τ_π)·log μ(a) + c_t with c_t shared by the position, so
    d = log μ − log π_old = (1 − r)·log μ − c_t. The weighted least-squares fit
    d ≈ a + b·log μ + c·H(π) over the uncertain tokens (H: π's entropy at the position, which
    absorbs most of c_t; left out where fewer than MIN_TOKENS tokens have it) gives r = 1 − b. Raw log-probs at τ = 0.5
    give r ≈ 2; a clean engine r ≈ 1 (its noise does not depend on log μ)."""
    has_h = "entropy" in pairs.collect_schema().names()
    if has_h:
        with_h = collect(pairs.filter(_uncertain() & pl.col("entropy").is_not_null()).select(pl.len())).item()
        has_h = with_h >= MIN_TOKENS
    h = pl.col("entropy").cast(pl.Float64) if has_h else pl.lit(0.0)
    rows = pairs.filter(_uncertain() & (h.is_not_null() if has_h else pl.lit(True)))
    x, y, w = pl.col("mu"), pl.col("d"), pl.col("w")
    terms = {"n": pl.len(), "sw": w.sum()}
    cols = {"1": pl.lit(1.0), "x": x, "h": h}
    keys = list(cols)
    for i, a in enumerate(keys):
        terms[f"y{a}"] = (w * y * cols[a]).sum()
        for b in keys[i:]:
            terms[f"{a}{b}"] = (w * cols[a] * cols[b]).sum()
    s = collect(rows.select(**{k: v.cast(pl.Float64) for k, v in terms.items()})).row(0, named=True)
    n = int(s["n"] or 0)
    if n < MIN_TOKENS:
        return None, n
    use = keys if has_h and (s["hh"] or 0) > 0 else keys[:2]
    gram = np.array([[s[f"{a}{b}"] if f"{a}{b}" in s else s[f"{b}{a}"] for b in use] for a in use])
    rhs = np.array([s[f"y{a}"] for a in use])
    if np.linalg.cond(gram) > 1e12:
        return None, n
    coef = np.linalg.solve(gram, rhs)
    return float(1.0 - coef[1]), n


def temperature_check(inp: Inputs) -> Finding:
    """1a. μ not at the sampling temperature.

    Statistic: r = τ_μ/τ_π from the fit of `temperature_ratio` (1 when μ and π_old share the
    temperature). Threshold: |r − 1| ≥ 0.15 warning, ≥ 0.3 problem (raw log-probs at τ = 0.5
    give r ≈ 2, at τ = 0.7 r ≈ 1.4). run.json's "sampling" (logprobs "raw" at τ ≠ 1) raises a
    warning by itself, and the summary says when the data contradict it."""
    sampling = inp.sampling
    r, n = temperature_ratio(inp.pairs)
    tau = sampling.temperature
    says_raw = sampling.logprobs == "raw" and tau is not None and tau != 1.0
    evidence: dict = {"ratio_tau_mu_over_tau_pi": r, "uncertain_tokens": n, "warning_at": TEMPERATURE_WARNING}
    evidence["problem_at"] = TEMPERATURE_PROBLEM
    evidence["temperature"] = tau
    evidence["logprobs"] = sampling.logprobs
    if r is None:
        verdict = "warning" if says_raw else "ok"
        summary = f"too few uncertain tokens ({n}) to measure μ's temperature" + (
            f"; run.json says raw log-probs at τ = {tau:g}" if says_raw else ""
        )
        return Finding("temperature", verdict, summary, evidence, _TEMPERATURE_FIX if says_raw else "")
    off = abs(r - 1.0)
    verdict = verdict_of(off, TEMPERATURE_WARNING, TEMPERATURE_PROBLEM)
    at = f" (μ looks sampled at τ = {r * tau:.2g}, π_old at {tau:g})" if tau and r > 0 else ""
    if verdict == "ok":
        summary = f"μ and π_old share the temperature: τ_μ/τ_π = {r:.3f}{at}"
        if says_raw:
            verdict = "warning"
            summary += f"; run.json says raw log-probs at τ = {tau:g}, which the data contradict"
    else:
        summary = f"μ is not at π_old's temperature: τ_μ/τ_π = {r:.3f}{at}"
        if says_raw:
            summary += "; run.json says raw log-probs"
    if verdict != "ok":
        evidence["examples"] = examples(inp.pairs.filter(_uncertain()), pl.col("d").abs())
    return Finding(
        "temperature",
        verdict,
        summary,
        evidence,
        _TEMPERATURE_FIX if verdict != "ok" else "",
        strength=off / TEMPERATURE_PROBLEM,
    )


_TEMPERATURE_FIX = (
    "return processed log-probs (vLLM: logprobs_mode='processed_logprobs') or divide the trainer's logits by the same τ"
)


def truncation_check(inp: Inputs) -> Finding:
    """1b. Truncated sampling support (top-p, top-k, min-p) with μ renormalised over it.

    Then log μ(a_t) − log π_old(a_t) = −log(kept mass of π_old) ≥ 0 at every position, larger
    where the entropy is higher. Statistic over the uncertain tokens (π_old(a_t) < 0.99): the
    (weighted) share s₊ with μ > π_old and their mean d. Clean engines' noise is symmetric
    (s₊ ≈ 0.5, mean d ≈ KL(μ‖π_old), small). Threshold: s₊ ≥ 0.75 and mean d ≥ 0.01 nats
    warning; s₊ ≥ 0.9 and mean d ≥ 0.02 problem. The evidence gives the mean d by entropy
    bucket (< 0.1, 0.1–1, ≥ 1 nats; growing with the entropy under truncation)."""
    rows = inp.pairs.filter(_uncertain())
    has_h = "entropy" in rows.collect_schema().names()
    w = pl.col("w")
    stats = collect(
        rows.select(
            pl.len().alias("n"),
            ((w * (pl.col("d") > 0)).sum() / w.sum()).alias("share"),
            ((w * pl.col("d")).sum() / w.sum()).alias("bias"),
        )
    ).row(0, named=True)
    n = int(stats["n"])
    sampling = inp.sampling
    evidence: dict = {"uncertain_tokens": n, "share_mu_above_old": stats["share"], "mean_d": stats["bias"]}
    evidence["thresholds"] = {
        "warning": [TRUNCATION_SHARE_WARNING, TRUNCATION_BIAS_WARNING],
        "problem": [TRUNCATION_SHARE_PROBLEM, TRUNCATION_BIAS_PROBLEM],
    }
    evidence["sampling"] = {"top_p": sampling.top_p, "top_k": sampling.top_k, "min_p": sampling.min_p}
    if n < MIN_TOKENS:
        return Finding("truncation", "ok", f"too few uncertain tokens ({n}) to look for a truncated support", evidence)
    share, bias = float(stats["share"]), float(stats["bias"])
    if share >= TRUNCATION_SHARE_PROBLEM and bias >= TRUNCATION_BIAS_PROBLEM:
        verdict = "problem"
    elif share >= TRUNCATION_SHARE_WARNING and bias >= TRUNCATION_BIAS_WARNING:
        verdict = "warning"
    else:
        verdict = "ok"
    if has_h:
        by_h = collect(
            rows.with_columns(bucket_of("entropy", ENTROPIES).alias("h"))
            .filter(pl.col("h").is_not_null())
            .group_by("h")
            .agg(((w * pl.col("d")).sum() / w.sum()).alias("mean_d"), w.sum().alias("tokens"))
            .sort("h")
        )
        evidence["mean_d_by_entropy"] = [
            {"entropy": f"{ENTROPIES[h][0]:g}–{ENTROPIES[h][1]:g}", "tokens": t, "mean_d": m}
            for h, m, t in by_h.iter_rows()
        ]
    claimed = sampling.truncated and sampling.logprobs != "raw"
    if verdict == "ok":
        summary = (
            f"no truncation bias: μ > π_old on {share:.1%} of uncertain tokens, mean log μ − log π_old {bias:+.4f}"
        )
        if claimed:
            summary += "; run.json says a truncated support with processed log-probs, which the data contradict"
            verdict = "warning"
    else:
        summary = (
            f"μ > π_old on {share:.1%} of uncertain tokens (mean log μ − log π_old {bias:+.4f} nats): "
            "μ looks renormalised over a truncated support"
        )
        if claimed:
            summary += " (run.json says so)"
        evidence["examples"] = examples(rows, pl.col("d"))
    strength = min(share / TRUNCATION_SHARE_PROBLEM, bias / TRUNCATION_BIAS_PROBLEM)
    return Finding(
        "truncation",
        verdict,
        summary,
        evidence,
        _TRUNCATION_FIX if verdict != "ok" else "",
        strength=max(strength, 0.0),
    )


_TRUNCATION_FIX = (
    "apply the same top-p/top-k/min-p mask to the trainer's logits (vLLM: return_sampling_mask) or take μ "
    "before truncation"
)


__all__ = ["temperature_check", "temperature_ratio", "truncation_check"]
