"""The truncated sampling support (1b): μ renormalised over the top-p / top-k / min-p support it
was drawn from, π_old not.

Three forms, the evidence's "form" says which ran. Where `record` got the engine's sampling masks
(pi_support_mass: Σ π over the support each token was drawn from) the check is exact ("sampling
mask"); where it got μ's top-K and π's logits (mu_topk_mass, pi_topk_mass) it compares μ's mass on
μ's top-K set with π's ("top-K"); otherwise it reads how d = log μ − log π_old (nats) leans over
the uncertain tokens and grows with π's entropy ("token-level"). "logprobs" says which kind of
log μ run.json says it is (raw, tempered, processed).
"""

from __future__ import annotations

import polars as pl

from trustlens.analysis.buckets import collect
from trustlens.analysis.diagnosis.finding import Finding, verdict_of
from trustlens.analysis.diagnosis.inputs import ENTROPIES, Inputs, Sampling, bucket_of, examples, fresh_note
from trustlens.analysis.diagnosis.registry import check
from trustlens.analysis.diagnosis.sampling import KINDS, MIN_TOKENS, uncertain
from trustlens.rules.columns import evaluate_columns, rule_columns
from trustlens.rules.resolve import resolve_rules

# truncation: share of uncertain tokens with μ > π_old, and their mean d (nats)
TRUNCATION_SHARE_WARNING = 0.75
TRUNCATION_SHARE_PROBLEM = 0.9
TRUNCATION_BIAS_WARNING = 0.01
TRUNCATION_BIAS_PROBLEM = 0.02
# truncation, top-K form: positions where π leaves at least OUTSIDE of its mass outside S; the
# mean share of that mass which μ moved onto S, (Σ_S μ − Σ_S π) / (1 − Σ_S π)
OUTSIDE = 0.01
MOVED_WARNING = 0.3
MOVED_PROBLEM = 0.6


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
    rows = pairs.filter(uncertain() & m.is_not_null() & (m > 0))
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

    Where the run has the engine's sampling masks (pi_support_mass) the data are truncation_bias's
    to judge, exactly: this check is then ok, saying so. Run.json's kind of μ: raw or tempered log μ with a truncating
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
    pairs, stale = inp.fresh  # a stale μ is an older policy, sharper or flatter than π_old by chance
    note = fresh_note(stale)
    rows = pairs.filter(uncertain())
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
    evidence: dict = {
        "uncertain_tokens": n,
        "share_mu_above_old": stats["share"],
        "mean_d": stats["bias"],
        "stale": stale,
    }
    evidence["sampling"] = {"top_p": sampling.top_p, "top_k": sampling.top_k, "min_p": sampling.min_p}
    # whether the masks are recorded decides the deferral to truncation_bias, which reads every token
    by_mask, by_topk = support_bias(inp.pairs), moved_mass(pairs)
    if by_mask is not None:  # exact from the masks: truncation_bias judges it, in closed form
        evidence["form"] = "sampling mask"
        verdict, strength = "ok", 0.0
        measured = "the engine's sampling masks are recorded (pi_support_mass): truncation_bias gives the bias exactly"
    elif by_topk is not None:
        verdict, strength, measured = _by_topk(by_topk, evidence)
    else:
        evidence["form"] = "token-level"
        evidence["thresholds"] = {
            "warning": [TRUNCATION_SHARE_WARNING, TRUNCATION_BIAS_WARNING],
            "problem": [TRUNCATION_SHARE_PROBLEM, TRUNCATION_BIAS_PROBLEM],
        }
        if n < MIN_TOKENS:
            return Finding(
                "truncation",
                "ok",
                f"too few uncertain tokens ({n}) to look for a truncated support{note}",
                evidence,
            )
        verdict, strength, measured = _by_tokens(float(stats["share"]), float(stats["bias"]))
    if by_mask is None:  # the forms judged here read the fresh tokens only
        measured += note
    if "entropy" in rows.collect_schema().names() and n:
        evidence["mean_d_by_entropy"] = _mean_d_by_entropy(rows)
    evidence["logprobs"] = sampling.logprobs
    verdict, summary, fix = _truncation_summary(sampling, verdict, measured, deferred=by_mask is not None)
    if verdict != "ok":
        evidence["examples"] = examples(rows, pl.col("d"))
    return Finding("truncation", verdict, summary, evidence, fix, strength=max(strength, 0.0))


def _by_topk(by_topk: dict, evidence: dict) -> tuple[str, float, str]:
    """(verdict, strength, what was measured) of the top-K form from `moved_mass`'s statistics,
    which join `evidence` with the thresholds."""
    moved = float(by_topk["moved"])
    evidence |= {"form": "top-K", **by_topk, "outside_at_least": OUTSIDE}
    evidence["thresholds"] = {"warning": MOVED_WARNING, "problem": MOVED_PROBLEM}
    where = f"{by_topk['tokens']} positions; Σ_S μ ≥ 0.999 on {by_topk['share_mu_all_on_s']:.1%}"
    if moved >= 0:
        measured = f"μ puts {moved:.1%} of the mass π leaves outside μ's top-K on it ({where})"
    else:  # μ holds less on its own top-K than π: nothing moved onto it
        measured = (
            f"μ moves none of the mass π leaves outside μ's top-K onto it: it holds less there than π, by "
            f"{-moved:.1%} of π's outside mass ({where})"
        )
    return verdict_of(moved, MOVED_WARNING, MOVED_PROBLEM), moved / MOVED_PROBLEM, measured


def _by_tokens(share: float, bias: float) -> tuple[str, float, str]:
    """(verdict, strength, what was measured) of the token-level form: the share s₊ of uncertain
    tokens with μ > π_old and their mean d (nats)."""
    if share >= TRUNCATION_SHARE_PROBLEM and bias >= TRUNCATION_BIAS_PROBLEM:
        verdict = "problem"
    elif share >= TRUNCATION_SHARE_WARNING and bias >= TRUNCATION_BIAS_WARNING:
        verdict = "warning"
    else:
        verdict = "ok"
    strength = min(share / TRUNCATION_SHARE_PROBLEM, bias / TRUNCATION_BIAS_PROBLEM)
    return verdict, strength, f"μ > π_old on {share:.1%} of uncertain tokens, mean log μ − log π_old {bias:+.4f} nats"


def _mean_d_by_entropy(rows: pl.LazyFrame) -> list[dict]:
    """The weighted mean d of `rows` by π's entropy bucket (ENTROPIES), with the tokens of each."""
    w = pl.col("w")
    by_h = collect(
        rows.with_columns(bucket_of("entropy", ENTROPIES).alias("h"))
        .filter(pl.col("h").is_not_null())
        .group_by("h")
        .agg(((w * pl.col("d")).sum() / w.sum()).alias("mean_d"), w.sum().alias("tokens"))
        .sort("h")
    )
    return [
        {"entropy": f"{ENTROPIES[h][0]:g}–{ENTROPIES[h][1]:g}", "tokens": t, "mean_d": m}
        for h, m, t in by_h.iter_rows()
    ]


def _truncation_summary(sampling: Sampling, verdict: str, measured: str, *, deferred: bool) -> tuple[str, str, str]:
    """(verdict, summary, fix) once run.json's sampling settings are read beside the data: raw or
    tempered log μ with a truncating filter warns by itself; processed log μ with a filter and no
    bias in the data warns that the data contradict it (unless `deferred`: the masks are recorded
    and truncation_bias reads the data)."""
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
    elif deferred:
        summary = measured
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
        summary += f" (run.json: {KINDS[sampling.logprobs]})"
    return verdict, summary, fix if verdict != "ok" else ""


@check("truncation_bias", kind="cause", cadence="early", order=55)
def truncation_bias_check(inp: Inputs) -> Finding:
    """The ratio's bias from a truncated support, in closed form where the engine's sampling masks
    are recorded (pi_support_mass S = Σ π over the support each token was drawn from).

    With μ renormalised over the support and π not, log μ − log π_old = −log S exactly (the
    ratio π/μ is S: biased by log S). Statistic (`support_bias`, over the uncertain tokens):
    e = mean d − |mean (d + log S)|, the part of the bias the support explains; e ≥ 0.01 nats
    warns, ≥ 0.02 is a problem. The evidence gives the bias, mean −log S in nats, and the share of
    the A ≠ 0 tokens whose decision under the active rule it changes (`moved_across`: the rule
    decided on the recorded log-probs and on those renormalised over the support). A run
    without the masks is ok, saying so (the truncation check reads it)."""
    by_mask = support_bias(inp.pairs)
    evidence: dict = {"thresholds": {"warning": TRUNCATION_BIAS_WARNING, "problem": TRUNCATION_BIAS_PROBLEM}}
    if by_mask is None:
        summary = "no sampling masks recorded (pi_support_mass): the truncation check reads the other forms"
        return Finding("truncation_bias", "ok", summary, evidence)
    evidence |= by_mask
    bias, rest = float(by_mask["mean_d"]), float(by_mask["mean_d_on_support"])
    explained = bias - abs(rest)  # a μ renormalised over S leaves d + log S ≈ 0
    verdict = verdict_of(explained, TRUNCATION_BIAS_WARNING, TRUNCATION_BIAS_PROBLEM)
    moved = moved_across(inp)
    evidence["moved_across"] = moved
    crossing = (
        f"; it moves {moved['share']:.2%} of the {moved['tokens']} A ≠ 0 tokens across {moved['rule']}'s threshold"
        if moved and moved.get("share") is not None
        else ""
    )
    measured = (
        f"the ratio π/μ carries log S = {-by_mask['mean_log_mass']:+.4f} nats on average (S = π's mass on the engine's "
        f"support, exact from its masks): mean log μ − log π_old {bias:+.4f} nats over {by_mask['tokens']} uncertain "
        f"tokens, {rest:+.4f} once π_old is renormalised over the support{crossing}"
    )
    if verdict == "ok":
        return Finding("truncation_bias", "ok", f"no truncation bias: {measured}", evidence)
    evidence["examples"] = examples(inp.pairs.filter(uncertain()), pl.col("d"))
    summary = f"{measured}: μ is renormalised over the truncated support and π is not"
    return Finding(
        "truncation_bias", verdict, summary, evidence, _TRUNCATION_FIX, strength=explained / TRUNCATION_BIAS_PROBLEM
    )


def moved_across(inp: Inputs) -> dict | None:
    """{"rule", "tokens", "share" (weighted share of the A ≠ 0 tokens with masks whose blocked
    decision changes once log π and log π_old are renormalised over the support, log p − log S),
    "into", "out_of" (of those, the shares now blocked / no longer blocked)} under run.json's
    active rule; "share" None with a "why" for a rule the masks cannot re-decide (top-K, sequence
    or batch rules); None without an active rule."""
    active = inp.manifest.get("active_rule")
    entry = (inp.manifest.get("rules") or {}).get(active) if isinstance(inp.manifest.get("rules"), dict) else None
    if not isinstance(active, str) or not isinstance(entry, dict):
        return None
    rule = resolve_rules({active: entry})[0]
    needs = [c for c in rule_columns(rule) if c not in ("pi_logp", "mu_logp", "old_logp", "advantage")]
    if needs or rule.level != "token":
        return {"rule": active, "tokens": 0, "share": None, "why": f"{active} reads {', '.join(needs) or rule.level}"}
    names = inp.pairs.collect_schema().names()
    cols = [c for c in ("pi_logp", "mu_logp", "old_logp", "advantage") if c in names]
    mass = pl.col("pi_support_mass").cast(pl.Float64)
    rows = collect(
        inp.pairs.filter(mass.is_not_null() & (mass > 0) & (pl.col("advantage") != 0)).select(
            *cols, "w", mass.alias("s")
        )
    )
    if rows.height == 0:
        return {"rule": active, "tokens": 0, "share": None, "why": "no A ≠ 0 tokens with masks"}
    on_support = rows.with_columns(
        (pl.col(c).cast(pl.Float64) - pl.col("s").log()).clip(upper_bound=0.0).alias(c)
        for c in ("pi_logp", "old_logp")
        if c in cols
    )
    recorded, renormalised = (evaluate_columns({active: entry}, f.drop("w", "s"))[active] for f in (rows, on_support))
    w = rows["w"]
    changed = (recorded != renormalised).fill_null(False)
    total = float(w.sum())
    return {
        "rule": active,
        "tokens": rows.height,
        "share": float(w.filter(changed).sum()) / total,
        "into": float(w.filter(changed & renormalised.fill_null(False)).sum()) / total,
        "out_of": float(w.filter(changed & recorded.fill_null(False)).sum()) / total,
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


__all__ = ["moved_across", "moved_mass", "support_bias", "truncation_bias_check", "truncation_check"]
