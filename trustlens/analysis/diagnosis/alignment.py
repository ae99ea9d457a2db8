"""Checks that log μ and log π_old describe the same token at the same place: shifted positions
(1c), sentinel values written for log μ (1d) and token ids that differ between engine and
trainer (1e)."""

from __future__ import annotations

import math

import polars as pl

from trustlens.analysis.buckets import collect
from trustlens.analysis.diagnosis.finding import Finding
from trustlens.analysis.diagnosis.inputs import Inputs, examples, fresh_note
from trustlens.analysis.diagnosis.registry import check

KEYS = ["step", "update", "rank", "sample"]  # one response at one update
# shift: g = rank corr(log μ_t, log π_old_{t±1}) (the better neighbour) − rank corr(log μ_t, log π_old_t)
SHIFT_WARNING = 0.0  # g above this warns (a neighbour agrees better than the own position)
SHIFT_PROBLEM = 0.2  # g above this is a problem
MIN_PAIRS = 50  # fewer positions with both neighbours: the shift check cannot tell
# sentinel: log μ = 0 exactly where π_old(a_t) is in [VISIBLE_LO, VISIBLE_HI] (plausible, yet far
# from certain), or log μ ≤ SENTINEL_NEG (no sampled token is that unlikely)
VISIBLE_LO, VISIBLE_HI = 1e-3, 0.5
SENTINEL_NEG = -50.0
SENTINEL_WARNING_SHARE = 0.001  # share of the visible tokens at which sentinels warn
SENTINEL_PROBLEM_SHARE = 0.01  # ... and are a problem
SENTINEL_PROBLEM_COUNT = 3  # ... with at least this many
# token ids: μ(a_t) ≥ TOKEN_MU while π_old(a_t) ≤ TOKEN_OLD
TOKEN_MU, TOKEN_OLD = 0.5, 1e-3
TOKEN_WARNING_SHARE = 1e-4  # share of all tokens
TOKEN_PROBLEM_SHARE = 1e-3
TOKEN_PROBLEM_COUNT = 3
# ... and those tokens make at least this share of the tokens with ρ = π_old/μ beyond [0.5, 2]: a
# wrong token id is an isolated outlier in an otherwise close pair of engines, where a policy
# that moved (stale rollouts) spreads its mismatch over every size
TOKEN_WARNING_ISOLATION = 0.1
TOKEN_PROBLEM_ISOLATION = 0.3


@check("shift", kind="cause", cadence="early", order=10)
def shift_check(inp: Inputs) -> Finding:
    """1c. Shifted positions: log μ at t agrees better with log π_old at t ± 1 than at t.

    Statistic, over positions whose two neighbours were recorded (a subsample of whole samples
    on large runs; unweighted): the Spearman rank correlations c₀ = corr(log μ_t, log π_old_t)
    and c± = corr(log μ_t, log π_old_{t±1}), and g = max(c₊, c₋) − c₀. A clean run has c₀ near 1
    and c± near the log-probs' own autocorrelation along a response (0 or below), also when μ is
    a stale policy (c₀ falls, c± does not rise). Ranks, not values: the huge log ratios of
    another defect (a wrong token id: log π_old ≈ −20 on a quarter of the tokens) would
    dominate a Pearson correlation. Threshold: g > 0 warns (a neighbour agrees better than the
    own position), g > 0.2 is a problem."""
    rows = inp.subsample(inp.pairs).select(*KEYS, "pos", "mu", "ref")
    ref = rows.select(*KEYS, "pos", "ref")
    joined = rows.join(
        ref.with_columns(pl.col("pos") - 1).rename({"ref": "ref_next"}), on=[*KEYS, "pos"], how="inner"
    ).join(ref.with_columns(pl.col("pos") + 1).rename({"ref": "ref_prev"}), on=[*KEYS, "pos"], how="inner")
    s = collect(
        joined.select(
            pl.len().alias("n"),
            pl.corr("mu", "ref", method="spearman").alias("own"),
            pl.corr("mu", "ref_next", method="spearman").alias("next"),
            pl.corr("mu", "ref_prev", method="spearman").alias("prev"),
        )
    ).row(0, named=True)
    n = int(s["n"])
    evidence: dict = {"positions": n, "corr_own": s["own"], "corr_next": s["next"], "corr_prev": s["prev"]}
    evidence["warning_above"] = SHIFT_WARNING
    evidence["problem_above"] = SHIFT_PROBLEM
    values = [s["own"], s["next"], s["prev"]]
    if n < MIN_PAIRS or any(v is None or math.isnan(v) for v in values):
        return Finding("shift", "ok", f"too few positions with both neighbours ({n}) to test for a shift", evidence)
    own, nxt, prev = (float(v) for v in values)
    gap = max(nxt, prev) - own
    direction = "t + 1" if nxt >= prev else "t − 1"
    evidence["gap"] = gap
    verdict = "problem" if gap > SHIFT_PROBLEM else ("warning" if gap > SHIFT_WARNING else "ok")
    if verdict == "ok":
        summary = (
            f"log μ agrees best with π_old at its own position (correlation {own:.3f}, "
            f"neighbours ≤ {max(nxt, prev):.3f})"
        )
        return Finding("shift", verdict, summary, evidence)
    summary = (
        f"log μ at t correlates better with log π_old at {direction} ({max(nxt, prev):.3f}) than at t ({own:.3f}): "
        "positions look shifted by one"
    )
    evidence["examples"] = examples(inp.pairs, pl.col("d").abs())
    fix = (
        "align the engine's log-probs with the trainer's: the logits at t predict the token at t + 1 "
        "(drop the prompt's last position, not the first response token)"
    )
    return Finding("shift", verdict, summary, evidence, fix, strength=gap / SHIFT_PROBLEM)


@check("sentinel", kind="cause", cadence="early", order=30)
def sentinel_check(inp: Inputs) -> Finding:
    """1d. Sentinels: log μ written as exactly 0, a large negative constant or nothing (null)
    where the value is unknown (padding, a failed request).

    Statistic: the count of tokens with log μ = 0 exactly while π_old(a_t) ∈ [0.001, 0.5] (the
    trainer finds the token plausible but far from certain; there, an engine in any precision
    would not round μ to 1), plus those with log μ ≤ −50 (a sampled token is never that
    unlikely), and their (weighted) share s of the tokens with π_old(a_t) ∈ [0.001, 0.5].
    Threshold: s ≥ 0.1% warns, s ≥ 1% with ≥ 3 tokens is a problem; missing μ on some rows of a
    run that records μ warns. A stale μ (`Inputs.fresh`) is judged on the tokens sampled with
    π_old's weights: an older policy that has grown sharp gives μ = 1, genuinely, to tokens π_old
    finds uncertain (1.4–3.2% of them on four collapsing runs 16 steps stale)."""
    pairs, stale = inp.fresh
    note = fresh_note(stale)
    visible = pl.col("ref").is_between(math.log(VISIBLE_LO), math.log(VISIBLE_HI))
    zero = (pl.col("mu") == 0) & visible
    negative = pl.col("mu") <= SENTINEL_NEG
    w = pl.col("w")
    s = collect(
        pairs.select(
            zero.sum().alias("zeros"),
            negative.sum().alias("negatives"),
            pl.when(zero | negative).then(w).sum().alias("weighted"),
            pl.when(visible).then(w).sum().alias("visible"),
        )
    ).row(0, named=True)
    missing = 0
    if inp.has_mu:
        missing = collect(
            inp.tokens.select((pl.col("mu_logp").is_null() & pl.col("old_logp").is_not_null()).sum())
        ).item()
    count = int(s["zeros"]) + int(s["negatives"])
    share = float(s["weighted"]) / float(s["visible"]) if s["visible"] else (1.0 if count else 0.0)
    evidence: dict = {
        "zeros": int(s["zeros"]),
        "large_negative": int(s["negatives"]),
        "share_of_visible": share,
        "visible_tokens": float(s["visible"] or 0),
        "missing_mu": int(missing),
        "problem_at": {"count": SENTINEL_PROBLEM_COUNT, "share": SENTINEL_PROBLEM_SHARE},
        "stale": stale,
    }
    if count >= SENTINEL_PROBLEM_COUNT and share >= SENTINEL_PROBLEM_SHARE:
        verdict = "problem"
    elif (count and share >= SENTINEL_WARNING_SHARE) or missing:
        verdict = "warning"
    else:
        summary = "no sentinel values in log μ" + (f" ({count} isolated zeros, {share:.3%})" if count else "")
        summary += note
        return Finding("sentinel", "ok", summary, evidence)
    parts = []
    if s["zeros"]:
        parts.append(f"{int(s['zeros'])} tokens with log μ = 0 where π_old(a_t) ≤ {VISIBLE_HI}")
    if s["negatives"]:
        parts.append(f"{int(s['negatives'])} with log μ ≤ {SENTINEL_NEG:g}")
    if missing:
        parts.append(f"{missing} rows without μ")
    summary = (
        "; ".join(parts) + f" ({share:.2%} of the tokens where a sentinel shows{note}): log μ holds placeholder values"
    )
    evidence["examples"] = examples(pairs.filter(zero | negative), pl.col("d").abs())
    fix = "mask the positions whose log-prob the engine did not return instead of writing 0 or a constant"
    return Finding("sentinel", verdict, summary, evidence, fix, strength=share / SENTINEL_PROBLEM_SHARE)


@check("token_ids", kind="cause", cadence="early", order=20)
def token_ids_check(inp: Inputs) -> Finding:
    """1e. Token ids that differ between engine and trainer (chat template, tokenizer, special
    tokens): the trainer scores another token than the one the engine sampled.

    Statistic: tokens with μ(a_t) ≥ 0.5 while π_old(a_t) ≤ 0.001 (log ratio ≥ 6.2 nats; no
    engine precision does that), their (weighted) share of all tokens, their isolation (their
    share of the tokens with ρ = π_old/μ beyond [0.5, 2]), and how they concentrate on positions
    and token ids (the evidence names the top ones). Threshold: share ≥ 0.01% with isolation
    ≥ 0.1 warns; share ≥ 0.1%, ≥ 3 tokens and isolation ≥ 0.3 is a problem. A stale μ
    (`Inputs.fresh`) is judged on the tokens sampled with π_old's weights: an older policy can be
    sure of a token the current one has all but ruled out."""
    pairs, stale = inp.fresh
    note = fresh_note(stale)
    odd = (pl.col("mu") >= math.log(TOKEN_MU)) & (pl.col("ref") <= math.log(TOKEN_OLD))
    w = pl.col("w")
    s = collect(
        pairs.select(
            odd.sum().alias("count"),
            pl.when(odd).then(w).sum().alias("weighted"),
            pl.when(pl.col("d").abs() > math.log(2.0)).then(w).sum().alias("extreme"),
            w.sum().alias("all"),
        )
    ).row(0, named=True)
    count = int(s["count"])
    share = float(s["weighted"] or 0) / float(s["all"]) if s["all"] else 0.0
    isolation = float(s["weighted"] or 0) / float(s["extreme"]) if s["extreme"] else 0.0
    evidence: dict = {
        "count": count,
        "share": share,
        "isolation": isolation,
        "warning_at": [TOKEN_WARNING_SHARE, TOKEN_WARNING_ISOLATION],
        "problem_at": [TOKEN_PROBLEM_SHARE, TOKEN_PROBLEM_ISOLATION],
        "stale": stale,
    }
    if count:
        for key in ("pos", "token_id"):
            top = collect(pairs.filter(odd).group_by(key).agg(pl.len().alias("n")).sort("n", descending=True).head(3))
            evidence[f"top_{key}"] = [{key: k, "count": n} for k, n in top.iter_rows()]
    if count >= TOKEN_PROBLEM_COUNT and share >= TOKEN_PROBLEM_SHARE and isolation >= TOKEN_PROBLEM_ISOLATION:
        verdict = "problem"
    elif count and share >= TOKEN_WARNING_SHARE and isolation >= TOKEN_WARNING_ISOLATION:
        verdict = "warning"
    else:
        summary = (
            "engine and trainer score the same tokens"
            + (
                f" ({count} tokens with μ ≥ {TOKEN_MU} and π_old ≤ {TOKEN_OLD:g}, {isolation:.1%} of the far-off ones: "
                "a mismatch spread over every size, not wrong ids)"
                if count
                else ""
            )
            + note
        )
        return Finding("token_ids", "ok", summary, evidence)
    where = evidence["top_pos"][0]
    summary = (
        f"{count} tokens ({share:.2%}) likely under μ (≥ {TOKEN_MU}) but near-impossible under π_old "
        f"(≤ {TOKEN_OLD:g}); most at position {where['pos']} ({where['count']}): the trainer scores other "
        f"token ids than the engine sampled{note}"
    )
    evidence["examples"] = examples(pairs.filter(odd), pl.col("d"))
    fix = (
        "tokenize once: train on the engine's token ids (same chat template and special tokens) instead of "
        "re-encoding the text"
    )
    return Finding(
        "token_ids",
        verdict,
        summary,
        evidence,
        fix,
        strength=min(share / TOKEN_PROBLEM_SHARE, isolation / TOKEN_PROBLEM_ISOLATION),
    )


__all__ = ["sentinel_check", "shift_check", "token_ids_check"]
