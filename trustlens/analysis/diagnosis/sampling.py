"""Checks of how μ was sampled: the temperature (1a) and a truncated support (1b).

Each has two forms. Where `record` got π's logits (at τ ≠ 1) and μ's top-K, the run holds
pi_logp_raw (log π(a_t) before the temperature) and mu_topk_mass / pi_topk_mass (Σ_S μ, Σ_S π
over μ's top-K set S): the checks compare log μ with both candidates and μ's mass on S with π's
("logits" form). Otherwise they read d = log μ(a_t) − log π_old(a_t) (nats) over the sampled
tokens: how d depends on log μ and on π's entropy ("token-level" form). Where `record` got the
engine's sampling masks (pi_support_mass: Σ π over the support each token was drawn from), the
truncation check is exact ("sampling mask" form). The evidence's "form" says which ran, and
"logprobs" which kind of log μ run.json says it is (raw, tempered, processed).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from trustlens.analysis.buckets import collect
from trustlens.analysis.diagnosis.finding import Finding, verdict_of
from trustlens.analysis.diagnosis.inputs import ENTROPIES, Inputs, Sampling, bucket_of, examples
from trustlens.analysis.diagnosis.registry import check

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
# temperature, logits form: tokens whose raw and processed log π differ by at least SEPARATION
# nats can tell them apart; the share of them where log μ is nearer the raw one
SEPARATION = 0.2
RAW_SHARE_WARNING = 0.25
RAW_SHARE_PROBLEM = 0.5
# truncation, top-K form: positions where π leaves at least OUTSIDE of its mass outside S; the
# mean share of that mass which μ moved onto S, (Σ_S μ − Σ_S π) / (1 − Σ_S π)
OUTSIDE = 0.01
MOVED_WARNING = 0.3
MOVED_PROBLEM = 0.6


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
    pairs, evidence["stale"] = inp.fresh()
    fresh_note = f" on the tokens sampled with π_old's weights ({evidence['stale']})" if evidence["stale"] else ""
    by_logits = raw_share(pairs)
    raw_note = (
        f"; run.json says raw log μ (before the temperature τ = {tau:g}): the ratio compares π at τ with μ at "
        "τ = 1, off on every uncertain token"
        if says_raw
        else ""
    )
    if by_logits is not None:
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
            f"{fresh_note}"
        )
        order = (pl.col("mu") - pl.col("pi_logp").cast(pl.Float64)).abs()
    else:
        r, n = temperature_ratio(pairs)
        evidence |= {"form": "token-level", "ratio_tau_mu_over_tau_pi": r, "uncertain_tokens": n}
        evidence |= {"warning_at": TEMPERATURE_WARNING, "problem_at": TEMPERATURE_PROBLEM}
        if r is None:
            verdict = "warning" if says_raw else "ok"
            summary = f"too few uncertain tokens ({n}) to measure μ's temperature{fresh_note}{raw_note}"
            return Finding("temperature", verdict, summary, evidence, _TEMPERATURE_FIX if says_raw else "")
        if r <= 0:
            summary = (
                f"the temperature fit fails: the slope of log μ − log π_old on log μ over {n} uncertain tokens "
                f"is {1.0 - r:.3f}, which gives no positive τ_μ/τ_π; log μ and log π_old differ in a way no "
                f"temperature explains (see the other checks){raw_note}"
            )
            evidence["fit_failed"] = True
            evidence["examples"] = examples(pairs.filter(_uncertain()), pl.col("d").abs())
            return Finding("temperature", "warning", summary, evidence, "", strength=0.5)
        off = abs(r - 1.0)
        verdict = verdict_of(off, TEMPERATURE_WARNING, TEMPERATURE_PROBLEM)
        strength = off / TEMPERATURE_PROBLEM
        at = f" (μ looks sampled at τ = {r * tau:.2g}, π_old at {tau:g})" if tau and r > 0 else ""
        measured = f"τ_μ/τ_π = {r:.3f}{at}{fresh_note}"
        order = pl.col("d").abs()
    if verdict == "ok":
        summary = f"μ and π_old share the temperature: {measured}"
        if says_raw:
            verdict = "warning"
            summary += f"{raw_note}, which the data contradict"
    else:
        summary = f"μ is not at π_old's temperature: {measured}{raw_note}"
        evidence["examples"] = examples(pairs.filter(_uncertain()), order)
    if sampling.logprobs is not None and not says_raw:
        summary += f" (run.json: {_KINDS[sampling.logprobs]})"
    return Finding(
        "temperature",
        verdict,
        summary,
        evidence,
        _TEMPERATURE_FIX if verdict != "ok" else "",
        strength=strength,
    )


_TEMPERATURE_FIX = (
    "take log μ after the temperature (vLLM: logprobs_mode='processed_logprobs'; SGLang: leave "
    "SGLANG_RETURN_ORIGINAL_LOGPROB unset) or divide the trainer's logits by the same τ"
)


def moved_mass(pairs: pl.LazyFrame) -> dict | None:
    """The top-K form of 1b over the positions with mu_topk_mass and pi_topk_mass where π leaves
    ≥ OUTSIDE of its mass outside μ's top-K set S: {"tokens", "moved" (the weighted mean of
    (Σ_S μ − Σ_S π) / (1 − Σ_S π), the share of π's mass outside S that μ put on S),
    "share_mu_all_on_s" (weighted share with Σ_S μ ≥ 0.999), "mean_pi_outside" (mean 1 − Σ_S π)};
    None when the run lacks the columns or has fewer than MIN_TOKENS such positions."""
    names = pairs.collect_schema().names()
    if "mu_topk_mass" not in names or "pi_topk_mass" not in names:
        return None
    mu_s, pi_s, w = pl.col("mu_topk_mass").cast(pl.Float64), pl.col("pi_topk_mass").cast(pl.Float64), pl.col("w")
    rows = pairs.filter(mu_s.is_not_null() & pi_s.is_not_null() & (pi_s <= 1.0 - OUTSIDE))
    stats = collect(
        rows.select(
            pl.len().alias("tokens"),
            ((w * (mu_s - pi_s) / (1.0 - pi_s)).sum() / w.sum()).alias("moved"),
            ((w * (mu_s >= 0.999)).sum() / w.sum()).alias("share_mu_all_on_s"),
            ((w * (1.0 - pi_s)).sum() / w.sum()).alias("mean_pi_outside"),
        )
    ).row(0, named=True)
    return stats if stats["tokens"] >= MIN_TOKENS else None


def support_bias(pairs: pl.LazyFrame) -> dict | None:
    """The sampling-mask form of 1b over the uncertain tokens with pi_support_mass m (Σ π over
    the engine's sampling support S, from its mask): {"tokens", "mean_d" (weighted mean of
    d = log μ − log π_old), "mean_d_on_support" (of d + log m: μ against π_old renormalised
    over S), "mean_log_mass" (of −log m, nats outside S)}; None without the column or below
    MIN_TOKENS tokens. A μ renormalised over S against an unrenormalised π_old gives mean_d ≈
    mean_log_mass and mean_d_on_support ≈ 0: the truncation's whole effect, exactly."""
    if "pi_support_mass" not in pairs.collect_schema().names():
        return None
    m, w = pl.col("pi_support_mass").cast(pl.Float64), pl.col("w")
    rows = pairs.filter(_uncertain() & m.is_not_null() & (m > 0))
    stats = collect(
        rows.select(
            pl.len().alias("tokens"),
            ((w * pl.col("d")).sum() / w.sum()).alias("mean_d"),
            ((w * (pl.col("d") + m.log())).sum() / w.sum()).alias("mean_d_on_support"),
            ((w * -m.log()).sum() / w.sum()).alias("mean_log_mass"),
        )
    ).row(0, named=True)
    return stats if stats["tokens"] >= MIN_TOKENS else None


@check("truncation", kind="cause", cadence="early", order=50)
def truncation_check(inp: Inputs) -> Finding:
    """1b. Truncated sampling support (top-p, top-k, min-p) with μ renormalised over it.

    Sampling-mask form (the run has pi_support_mass, `support_bias`): e = mean d − |mean d once
    π_old is renormalised over the support|, the bias the support explains; e ≥ 0.01 nats
    warning, ≥ 0.02 problem. Run.json's kind of μ: raw or tempered log μ with a truncating
    filter warns by itself (the tokens were drawn from the truncated distribution, so μ is not
    their sampling probability).

    Top-K form (the run has mu_topk_mass and pi_topk_mass): m = the mean share of π's mass
    outside μ's top-K set S that μ puts on S, over the positions where π leaves ≥ 1% outside S
    (`moved_mass`). A μ renormalised over a support inside S has Σ_S μ = 1: m = 1; a clean engine
    m ≈ 0. Threshold: m ≥ 0.3 warning, ≥ 0.6 problem.

    Token-level form: then log μ(a_t) − log π_old(a_t) = −log(kept mass of π_old) ≥ 0 at every
    position, larger where the entropy is higher. Statistic over the uncertain tokens
    (π_old(a_t) < 0.99): the (weighted) share s₊ with μ > π_old and their mean d. Clean engines'
    noise is symmetric (s₊ ≈ 0.5, mean d ≈ KL(μ‖π_old), small). Threshold: s₊ ≥ 0.75 and mean
    d ≥ 0.01 nats warning; s₊ ≥ 0.9 and mean d ≥ 0.02 problem. The evidence gives the mean d by
    entropy bucket (< 0.1, 0.1–1, ≥ 1 nats; growing with the entropy under truncation), in both
    forms."""
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
    evidence["sampling"] = {"top_p": sampling.top_p, "top_k": sampling.top_k, "min_p": sampling.min_p}
    by_topk = moved_mass(inp.pairs)
    by_mask = support_bias(inp.pairs)
    if by_mask is not None:
        bias, rest = float(by_mask["mean_d"]), float(by_mask["mean_d_on_support"])
        evidence |= {"form": "sampling mask", **by_mask}
        evidence["thresholds"] = {"warning": TRUNCATION_BIAS_WARNING, "problem": TRUNCATION_BIAS_PROBLEM}
        # the share of the bias the support explains decides: a μ renormalised over S leaves d + log m ≈ 0
        explained = bias - abs(rest)
        verdict = verdict_of(explained, TRUNCATION_BIAS_WARNING, TRUNCATION_BIAS_PROBLEM)
        strength = explained / TRUNCATION_BIAS_PROBLEM
        measured = (
            f"mean log μ − log π_old {bias:+.4f} nats over {by_mask['tokens']} uncertain tokens, "
            f"{rest:+.4f} once π_old is renormalised over the engine's sampling support (exact, from its masks; "
            f"π leaves {by_mask['mean_log_mass']:.4f} nats outside it)"
        )
    elif by_topk is not None:
        moved = float(by_topk["moved"])
        evidence |= {"form": "top-K", **by_topk, "outside_at_least": OUTSIDE}
        evidence["thresholds"] = {"warning": MOVED_WARNING, "problem": MOVED_PROBLEM}
        verdict = verdict_of(moved, MOVED_WARNING, MOVED_PROBLEM)
        strength = moved / MOVED_PROBLEM
        where = f"{by_topk['tokens']} positions; Σ_S μ ≥ 0.999 on {by_topk['share_mu_all_on_s']:.1%}"
        if moved >= 0:
            measured = f"μ puts {moved:.1%} of the mass π leaves outside μ's top-K on it ({where})"
        else:  # μ holds less on its own top-K than π: nothing moved onto it
            measured = (
                f"μ moves none of the mass π leaves outside μ's top-K onto it: it holds less there than π, by "
                f"{-moved:.1%} of π's outside mass ({where})"
            )
    else:
        evidence["form"] = "token-level"
        evidence["thresholds"] = {
            "warning": [TRUNCATION_SHARE_WARNING, TRUNCATION_BIAS_WARNING],
            "problem": [TRUNCATION_SHARE_PROBLEM, TRUNCATION_BIAS_PROBLEM],
        }
        if n < MIN_TOKENS:
            return Finding(
                "truncation", "ok", f"too few uncertain tokens ({n}) to look for a truncated support", evidence
            )
        share, bias = float(stats["share"]), float(stats["bias"])
        if share >= TRUNCATION_SHARE_PROBLEM and bias >= TRUNCATION_BIAS_PROBLEM:
            verdict = "problem"
        elif share >= TRUNCATION_SHARE_WARNING and bias >= TRUNCATION_BIAS_WARNING:
            verdict = "warning"
        else:
            verdict = "ok"
        strength = min(share / TRUNCATION_SHARE_PROBLEM, bias / TRUNCATION_BIAS_PROBLEM)
        measured = f"μ > π_old on {share:.1%} of uncertain tokens, mean log μ − log π_old {bias:+.4f} nats"
    if has_h and n:
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
    evidence["logprobs"] = sampling.logprobs
    claimed = sampling.truncated and sampling.logprobs in ("processed", None)
    untruncated = sampling.truncated and sampling.logprobs in ("raw", "tempered")
    fix = _TRUNCATION_FIX
    if untruncated:  # the settings alone: μ is not the tokens' sampling probability
        summary = (
            f"run.json says {sampling.logprobs} log μ (before truncation) with {_filters(sampling)}: the tokens were "
            "drawn from the truncated distribution, so μ is not their sampling probability and every ratio misses "
            f"the factor 1 / (μ's mass on the support) ({measured})"
        )
        verdict = "warning" if verdict == "ok" else verdict
        fix = _UNTRUNCATED_FIX
    elif verdict == "ok":
        summary = f"no truncation bias: {measured}"
        if claimed and sampling.logprobs == "processed":
            summary += "; run.json says a truncated support with processed log-probs, which the data contradict"
            verdict = "warning"
    else:
        summary = f"{measured}: μ looks renormalised over a truncated support"
        if claimed:
            summary += f" (run.json says {_filters(sampling)})"
    if sampling.logprobs is not None and not untruncated:
        summary += f" (run.json: {_KINDS[sampling.logprobs]})"
    if verdict != "ok":
        evidence["examples"] = examples(rows, pl.col("d"))
    return Finding(
        "truncation",
        verdict,
        summary,
        evidence,
        fix if verdict != "ok" else "",
        strength=max(strength, 0.0),
    )


# the kinds of log μ as the summaries name them
_KINDS = {
    "raw": "raw log μ, before the temperature",
    "tempered": "tempered log μ, after the temperature and before truncation",
    "processed": "processed log μ, of the distribution the tokens were drawn from",
}


def _filters(sampling: Sampling) -> str:
    """The truncating filters of `sampling`, e.g. "top_p 0.9, top_k 50"."""
    given = {"top_p": sampling.top_p, "top_k": sampling.top_k, "min_p": sampling.min_p}
    return ", ".join(f"{k} {v:g}" for k, v in given.items() if v is not None) or "no filter"


_TRUNCATION_FIX = (
    "give π the support μ was drawn from: apply the engine's sampling mask to the trainer's logits (vLLM and "
    "SGLang: return_sampling_mask) so both are renormalised over it"
)
_UNTRUNCATED_FIX = (
    "record the processed μ (vLLM: logprobs_mode='processed_logprobs'; SGLang: return_sampling_mask and "
    "from_sglang(processed=True)) and apply the same sampling mask to π"
)


__all__ = ["moved_mass", "raw_share", "support_bias", "temperature_check", "temperature_ratio", "truncation_check"]
