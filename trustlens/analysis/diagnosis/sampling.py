"""The sampling temperature (1a): is log μ taken at the temperature the tokens were sampled at,
and the helpers every check of how μ was sampled shares (trustlens.analysis.diagnosis.support
holds the truncated support, 1b).

Two forms. Where `record` got π's logits at τ ≠ 1, the run holds pi_logp_raw (log π(a_t) before
the temperature): the check compares log μ with both candidates ("logits" form). Otherwise it
reads how d = log μ(a_t) − log π_old(a_t) (nats) depends on log μ and on π's entropy over the
sampled tokens ("token-level" form). The evidence's "form" says which ran, and "logprobs" which
kind of log μ run.json says it is (raw, tempered, processed).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from trustlens.analysis.buckets import collect
from trustlens.analysis.diagnosis.finding import Finding, verdict_of
from trustlens.analysis.diagnosis.inputs import Inputs, examples, fresh_note
from trustlens.analysis.diagnosis.registry import check

# temperature: |r − 1| at which the check warns / finds a problem (r = τ_μ / τ_π, see below)
TEMPERATURE_WARNING = 0.15
TEMPERATURE_PROBLEM = 0.3
MIN_TOKENS = 50  # fewer uncertain tokens than this: the checks cannot tell
# a token is "uncertain" when π_old(a_t) < UNCERTAIN: only there can a bias of d show
UNCERTAIN = 0.99
# temperature, logits form: tokens whose raw and processed log π differ by at least SEPARATION
# nats can tell them apart; the share of them where log μ is nearer the raw one
SEPARATION = 0.2
RAW_SHARE_WARNING = 0.25
RAW_SHARE_PROBLEM = 0.5


def uncertain() -> pl.Expr:
    """The uncertain tokens, π_old(a_t) < UNCERTAIN: only there can a bias of d show."""
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
        with_h = collect(pairs.filter(uncertain() & pl.col("entropy").is_not_null()).select(pl.len())).item()
        has_h = with_h >= MIN_TOKENS
    h = pl.col("entropy").cast(pl.Float64) if has_h else pl.lit(0.0)
    rows = pairs.filter(uncertain() & (h.is_not_null() if has_h else pl.lit(True)))
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


def raw_share(pairs: pl.LazyFrame) -> dict | None:
    """The logits form of 1a over the tokens with pi_logp_raw whose raw and processed log π
    differ by ≥ SEPARATION nats: {"tokens", "share_nearer_raw" (weighted share with
    |log μ − log π_raw| < |log μ − log π|), "mean_abs_to_pi", "mean_abs_to_raw" (nats)}; None
    when the run lacks the column or has fewer than MIN_TOKENS such tokens."""
    if "pi_logp_raw" not in pairs.collect_schema().names():
        return None
    pi, raw, w = pl.col("pi_logp").cast(pl.Float64), pl.col("pi_logp_raw").cast(pl.Float64), pl.col("w")
    to_pi, to_raw = (pl.col("mu") - pi).abs(), (pl.col("mu") - raw).abs()
    rows = pairs.filter(raw.is_not_null() & ((pi - raw).abs() >= SEPARATION))
    stats = collect(
        rows.select(
            pl.len().alias("tokens"),
            ((w * (to_raw < to_pi)).sum() / w.sum()).alias("share_nearer_raw"),
            ((w * to_pi).sum() / w.sum()).alias("mean_abs_to_pi"),
            ((w * to_raw).sum() / w.sum()).alias("mean_abs_to_raw"),
        )
    ).row(0, named=True)
    return stats if stats["tokens"] >= MIN_TOKENS else None


@check("temperature", kind="cause", cadence="early", order=40)
def temperature_check(inp: Inputs) -> Finding:
    """1a. μ not at the sampling temperature.

    Logits form (the run has pi_logp_raw): q = the share of the tokens that can tell them apart
    (raw and processed log π ≥ SEPARATION nats apart) whose log μ is nearer log π_raw than
    log π. Threshold: q ≥ 0.25 warning, ≥ 0.5 problem (raw log-probs give q ≈ 1, a clean engine
    q ≈ 0), and only where log μ is also nearer log π_raw on average (a stale or noisy μ, far
    from both, is nearer either by chance). Token-level form: r = τ_μ/τ_π from the fit of
    `temperature_ratio` (1 when μ and π_old share the temperature); |r − 1| ≥ 0.15 warning,
    ≥ 0.3 problem (raw log-probs at τ = 0.5 give r ≈ 2, at τ = 0.7 r ≈ 1.4). run.json's
    "sampling" (logprobs "raw" at τ ≠ 1) raises a warning by itself, and the summary says when
    the data contradict it. A fit that gives r ≤ 0 (no temperature does) fails: a warning that
    says so. A stale μ (`Inputs.fresh`) is an older policy, nearer either candidate by chance:
    both forms then read only the tokens sampled with π_old's weights (too few: it cannot tell)."""
    sampling = inp.sampling
    tau = sampling.temperature
    says_raw = sampling.logprobs == "raw" and tau is not None and tau != 1.0
    evidence: dict = {"temperature": tau, "logprobs": sampling.logprobs, "processors": list(sampling.processors)}
    pairs, evidence["stale"] = inp.fresh
    note = fresh_note(evidence["stale"])
    by_logits = raw_share(pairs)
    raw_note = (
        f"; run.json says raw log μ (before the temperature τ = {tau:g}): the ratio compares π at τ with μ at "
        "τ = 1, off on every uncertain token"
        if says_raw
        else ""
    )
    if by_logits is not None:
        verdict, strength, measured = _by_logits(by_logits, evidence)
        order = (pl.col("mu") - pl.col("pi_logp").cast(pl.Float64)).abs()
    else:
        fitted = _by_fit(pairs, tau, evidence, says_raw, raw_note, note)
        if isinstance(fitted, Finding):
            return fitted
        verdict, strength, measured = fitted
        order = pl.col("d").abs()
    measured += note
    if verdict == "ok":
        summary = f"μ and π_old share the temperature: {measured}"
        if says_raw:
            verdict = "warning"
            summary += f"{raw_note}, which the data contradict"
    else:
        summary = f"μ is not at π_old's temperature: {measured}{raw_note}"
        evidence["examples"] = examples(pairs.filter(uncertain()), order)
    if sampling.logprobs is not None and not says_raw:
        summary += f" (run.json: {KINDS[sampling.logprobs]})"
    fix = _TEMPERATURE_FIX if verdict != "ok" else ""
    return Finding("temperature", verdict, summary, evidence, fix, strength=strength)


def _by_logits(by_logits: dict, evidence: dict) -> tuple[str, float, str]:
    """(verdict, strength, what was measured) of the logits form from `raw_share`'s statistics,
    which join `evidence` with the thresholds."""
    q = float(by_logits["share_nearer_raw"])
    evidence |= {"form": "logits", **by_logits, "separation": SEPARATION}
    evidence |= {"warning_at": RAW_SHARE_WARNING, "problem_at": RAW_SHARE_PROBLEM}
    # a μ far from both candidates (a stale or noisy engine) is nearer either by chance: raw
    # log-probs are also nearer log π_raw on average
    nearer_raw = by_logits["mean_abs_to_raw"] < by_logits["mean_abs_to_pi"]
    verdict = verdict_of(q, RAW_SHARE_WARNING, RAW_SHARE_PROBLEM) if nearer_raw else "ok"
    strength = q / RAW_SHARE_PROBLEM if nearer_raw else 0.0
    measured = (
        f"log μ is nearer log π before the temperature than after it on {q:.1%} of "
        f"{by_logits['tokens']} tokens (mean |Δ| {by_logits['mean_abs_to_raw']:.3f} against "
        f"{by_logits['mean_abs_to_pi']:.3f} nats{'' if nearer_raw else ': nearer after it on average'})"
    )
    return verdict, strength, measured


def _by_fit(
    pairs: pl.LazyFrame, tau: float | None, evidence: dict, says_raw: bool, raw_note: str, on_fresh: str
) -> tuple[str, float, str] | Finding:
    """(verdict, strength, what was measured) of the token-level form (`temperature_ratio`'s
    fit, which joins `evidence`), or the finding itself when the fit cannot tell (too few tokens)
    or fails (r ≤ 0)."""
    r, n = temperature_ratio(pairs)
    evidence |= {"form": "token-level", "ratio_tau_mu_over_tau_pi": r, "uncertain_tokens": n}
    evidence |= {"warning_at": TEMPERATURE_WARNING, "problem_at": TEMPERATURE_PROBLEM}
    if r is None:
        verdict = "warning" if says_raw else "ok"
        summary = f"too few uncertain tokens ({n}) to measure μ's temperature{on_fresh}{raw_note}"
        return Finding("temperature", verdict, summary, evidence, _TEMPERATURE_FIX if says_raw else "")
    if r <= 0:
        summary = (
            f"the temperature fit fails: the slope of log μ − log π_old on log μ over {n} uncertain tokens "
            f"is {1.0 - r:.3f}, which gives no positive τ_μ/τ_π; log μ and log π_old differ in a way no "
            f"temperature explains (see the other checks){raw_note}"
        )
        evidence["fit_failed"] = True
        evidence["examples"] = examples(pairs.filter(uncertain()), pl.col("d").abs())
        return Finding("temperature", "warning", summary, evidence, "", strength=0.5)
    off = abs(r - 1.0)
    at = f" (μ looks sampled at τ = {r * tau:.2g}, π_old at {tau:g})" if tau and r > 0 else ""
    return (
        verdict_of(off, TEMPERATURE_WARNING, TEMPERATURE_PROBLEM),
        off / TEMPERATURE_PROBLEM,
        f"τ_μ/τ_π = {r:.3f}{at}",
    )


_TEMPERATURE_FIX = (
    "take log μ after the temperature (vLLM: logprobs_mode='processed_logprobs'; SGLang: leave "
    "SGLANG_RETURN_ORIGINAL_LOGPROB unset) or divide the trainer's logits by the same τ"
)


# the kinds of log μ as the summaries name them
KINDS = {
    "raw": "raw log μ, before the temperature",
    "tempered": "tempered log μ, after the temperature and before truncation",
    "processed": "processed log μ, of the distribution the tokens were drawn from",
}


__all__ = ["KINDS", "MIN_TOKENS", "UNCERTAIN", "raw_share", "temperature_check", "temperature_ratio", "uncertain"]
