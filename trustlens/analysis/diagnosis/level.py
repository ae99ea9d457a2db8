"""Checks that describe the mismatch itself: where it sits (1f), its level against the ranges
published for dense and MoE models (1g), and whether it grows without training (1h)."""

from __future__ import annotations

import math

import polars as pl

from trustlens.analysis.buckets import bucket_expr, bucket_table, collect
from trustlens.analysis.collapse.levels import MISMATCH_K3_NORMAL
from trustlens.analysis.diagnosis.finding import Finding
from trustlens.analysis.diagnosis.inputs import ENTROPIES, Inputs, bucket_of, examples
from trustlens.analysis.diagnosis.registry import check
from trustlens.core.numbers import decimal, percent

# where: position buckets [lo, hi) of the response
POSITIONS = ((0, 1), (1, 4), (4, 16), (16, 64), (64, 256), (256, 1 << 30))
FIRST_WARNING = 0.1  # mean |log μ − log π_old| on the first token (nats) that warns ...
FIRST_PROBLEM = math.log(1.5)  # ... and that is a problem (an average ratio beyond 1.5×)
FIRST_FACTOR = 5.0  # ... when it is also this many times the rest's
# level: the published ranges of k3 (docs/doctor.md), dense's upper end as the collapse alerts use it
K3_RANGE = {"dense": (1e-5, MISMATCH_K3_NORMAL["dense"]), "moe": (1e-3, 1e-1)}
PROB_DIFF_WARNING = 0.01  # verl: prob_diff_mean above 0.01 points at the engine's precision
EXTREME_PROBLEM = 0.1  # R3: more than 10% of tokens with ρ > 2 or ρ < 0.5
K3_PROBLEM_FACTOR = 10.0  # k3 this many times the range's upper end is a problem
# engine_drift: growth of k3 (mean of the last third of the steps over the first third)
DRIFT_GROWTH = 4.0  # (|Δ log p| doubling shows as k3 × 4)
STATIC_MOVE = 1e-6  # mean |log π − log π_old| at updates ≥ 1 below this: the policy did not move
MIN_STEPS = 6
WHERE_MIN_ROWS = 50  # where: a position bucket with fewer kept rows is not named as the largest
MIN_FRESH = 50  # level: fresh tokens (staleness 0) needed to judge the engine on them alone


def _position_label(lo: int, hi: int) -> str:
    if hi - lo == 1:
        return str(lo)
    return f"{lo}+" if hi == POSITIONS[-1][1] else f"{lo}–{hi - 1}"


def _mean_abs_d() -> pl.Expr:
    w = pl.col("w")
    return (w * pl.col("d").abs()).sum() / w.sum()


def _table(pairs: pl.LazyFrame, key: pl.Expr) -> pl.DataFrame:
    """Per bucket: tokens (the rows' weight: the tokens they stand for), rows (kept rows) and the
    weighted mean |d|."""
    return collect(
        pairs.with_columns(key.alias("bucket"))
        .group_by("bucket")
        .agg(pl.col("w").sum().alias("tokens"), pl.len().alias("rows"), _mean_abs_d().alias("mean_abs_d"))
        .sort("bucket")
    )


def _rows_text(bucket: dict, weighted: bool) -> str:
    """ "28 rows" (and on a sampled run ", standing for 412 tokens"): what a statement rests on."""
    rows = f"{bucket['rows']} row{'s' if bucket['rows'] != 1 else ''}"
    return f"{rows} standing for {bucket['tokens']:.0f} tokens" if weighted else rows


@check("where", kind="symptom", cadence="every", order=20)
def where_check(inp: Inputs) -> Finding:
    """1f. Where the mismatch sits: mean |log μ − log π_old| (nats) by position in the response
    (0, 1–3, 4–15, 16–63, 64–255, 256+), by π's entropy (< 0.1, 0.1–1, ≥ 1 nats) and by μ
    decade, in the evidence.

    Verdict from the first token, where engines and trainers most often disagree on the context
    (TRL #4159: an IS ratio of 2.0 on first tokens): its mean |Δ| ≥ 0.1 nats and ≥ 5× the other
    positions' warns; ≥ log 1.5 (a ratio beyond 1.5× on average) and ≥ 5× is a problem. The
    summary names the position where the mismatch is largest among those with ≥ WHERE_MIN_ROWS
    kept rows, with its row count (and on a sampled run the tokens they stand for)."""
    pairs = inp.pairs
    by_pos = _table(pairs, bucket_of("pos", POSITIONS))
    evidence: dict = {
        "by_position": [
            {"pos": _position_label(*POSITIONS[b]), "tokens": t, "rows": n, "mean_abs_d": m}
            for b, t, n, m in by_pos.iter_rows()
            if b is not None
        ],
    }
    if "entropy" in pairs.collect_schema().names():
        by_h = _table(pairs.filter(pl.col("entropy").is_not_null()), bucket_of("entropy", ENTROPIES))
        evidence["by_entropy"] = [
            {"entropy": f"{ENTROPIES[b][0]:g}–{ENTROPIES[b][1]:g}", "tokens": t, "rows": n, "mean_abs_d": m}
            for b, t, n, m in by_h.iter_rows()
        ]
    labels = bucket_table()["label"].to_list()
    by_mu = _table(pairs, bucket_expr("mu"))
    evidence["by_mu_decade"] = [
        {"mu": labels[b], "tokens": t, "rows": n, "mean_abs_d": m} for b, t, n, m in by_mu.iter_rows()
    ]
    s = collect(
        pairs.select(
            pl.when(pl.col("pos") == 0).then(pl.col("w") * pl.col("d").abs()).sum().alias("first_sum"),
            pl.when(pl.col("pos") == 0).then(pl.col("w")).sum().alias("first_w"),
            (pl.col("pos") == 0).sum().alias("first_n"),
            pl.when(pl.col("pos") > 0).then(pl.col("w") * pl.col("d").abs()).sum().alias("rest_sum"),
            pl.when(pl.col("pos") > 0).then(pl.col("w")).sum().alias("rest_w"),
        )
    ).row(0, named=True)
    if not s["first_w"] or not s["rest_w"]:
        return Finding("where", "ok", "too few tokens to compare the first position with the rest", evidence)
    first, rest = s["first_sum"] / s["first_w"], s["rest_sum"] / s["rest_w"]
    factor = first / rest if rest > 0 else math.inf
    evidence |= {"first_token_mean_abs_d": first, "rest_mean_abs_d": rest, "first_over_rest": factor}
    verdict = "ok"
    if factor >= FIRST_FACTOR:
        verdict = "problem" if first >= FIRST_PROBLEM else ("warning" if first >= FIRST_WARNING else "ok")
    if verdict == "ok":
        solid = [r for r in evidence["by_position"] if r["rows"] >= WHERE_MIN_ROWS]
        if solid:
            worst = max(solid, key=lambda r: r["mean_abs_d"] or 0.0)
            summary = (
                f"the mismatch is largest at position {worst['pos']} (mean |Δ log p| {worst['mean_abs_d']:.4f} nats "
                f"over {_rows_text(worst, inp.weighted)}); no first-token excess"
            )
        else:
            summary = (
                f"no position holds {WHERE_MIN_ROWS} rows to say where the mismatch is largest; no first-token excess"
            )
        return Finding("where", verdict, summary, evidence)
    first_rows = {"rows": s["first_n"], "tokens": s["first_w"]}
    summary = (
        f"the first token carries a mean |log μ − log π_old| of {first:.3f} nats (ratio ~{math.exp(first):.2f}) over "
        f"{_rows_text(first_rows, inp.weighted)}, {factor:.0f}× the other positions'"
    )
    evidence["examples"] = examples(pairs.filter(pl.col("pos") == 0), pl.col("d").abs())
    fix = (
        "compare the first response token's context in engine and trainer (chat template, BOS, the prompt's last token)"
    )
    return Finding("where", verdict, summary, evidence, fix, strength=first / FIRST_PROBLEM)


@check("level", kind="symptom", cadence="every", order=30)
def level_check(inp: Inputs) -> Finding:
    """1g. The level of the mismatch against the published ranges.

    Statistics over the whole run (token-weighted means of the per-step values of
    `trustlens.analysis.mismatch_per_step`, exact on a sampled run): k3_kl, prob_diff_mean, and
    the share of tokens with ρ = π_old/μ > 2 or < 0.5. Ranges: k3 1e-5–1e-3 for dense models
    and 1e-3–1e-1 for MoE (run.json's model_kind; default dense); verl: prob_diff_mean below
    0.005 is normal, above 0.01 points at the engine's precision; R3: over 10% of tokens with
    ρ > 2 is a problem. Threshold: k3 above its range or prob_diff_mean > 0.01 warns; k3 over
    10× the range's upper end or an extreme share > 10% is a problem — a warning only in a run
    whose config sets rollout_lag > 0 (stale rollouts: μ is an older policy by design).

    A run with the per-token `staleness` column (the engine's weight versions) is judged on its
    fresh tokens (staleness 0, sampled with π_old's weights) when it has ≥ MIN_FRESH of them,
    without the cap: the stale tokens' mismatch is the staleness, theirs the engine's. With
    fewer fresh tokens, stale tokens cap the verdict at a warning as rollout_lag does."""
    w = pl.col("w")
    extreme = (pl.col("d").abs() > math.log(2.0)).cast(pl.Float64)
    lo, hi = K3_RANGE[inp.model_kind]
    evidence: dict = {"model_kind": inp.model_kind, "k3_range": [lo, hi]}
    lags = _staleness(inp)
    fresh = lags is not None and lags["fresh_rows"] >= MIN_FRESH
    pairs = inp.pairs.filter(pl.col("staleness") == 0) if fresh else inp.pairs
    share = collect(pairs.select(((w * extreme).sum() / w.sum()).alias("x"))).item()
    evidence["extreme_share"] = share
    per_step = inp.per_step
    if per_step.is_empty() or share is None:
        return Finding("level", "ok", "no μ–π_old pairs to measure", evidence)
    if fresh:  # k3 = E[ρ − 1 − log ρ] and E|π_old − μ| over the fresh tokens, ρ = π_old/μ = e^(−d)
        k3_row = (-pl.col("d")).exp() - 1 + pl.col("d")
        diff = (pl.col("mu").exp() - pl.col("ref").exp()).abs()
        got = collect(pairs.select((w * k3_row).sum() / w.sum(), ((w * diff).sum() / w.sum()).alias("p"))).row(0)
        k3, pdm = float(got[0]), float(got[1])
    else:
        n = per_step["tokens"].cast(pl.Float64)
        k3 = float((per_step["k3_kl"] * n).sum()) / float(n.sum())
        pdm = float((per_step["prob_diff_mean"] * n).sum()) / float(n.sum())
    evidence |= {"k3_kl": k3, "prob_diff_mean": pdm, "prob_diff_warning": PROB_DIFF_WARNING}
    evidence["extreme_problem"] = EXTREME_PROBLEM
    strength = max(k3 / (K3_PROBLEM_FACTOR * hi), share / EXTREME_PROBLEM)
    lag = inp.config.get("rollout_lag")
    if lags is not None:
        evidence["staleness"] = lags
        stale = not fresh and lags["stale_share"] > 0
        why = f"{percent(lags['stale_share'])} of tokens stale, mean staleness {lags['mean']:.2f} updates"
    else:
        stale = isinstance(lag, int | float) and lag > 0
        why = f"rollout_lag {lag}"
    on = f" over the {lags['fresh_rows']} tokens sampled with π_old's weights ({why})" if fresh and lags else ""
    text = (
        f"k3 {decimal(k3)} ({inp.model_kind} range {lo:g}–{hi:g}), prob_diff_mean {decimal(pdm)}, "
        f"ρ beyond [0.5, 2] on {percent(share)}{on}"
    )
    if strength >= 1:
        verdict = "warning" if stale else "problem"
    elif k3 > hi or pdm > PROB_DIFF_WARNING:
        verdict = "warning"
    elif k3 < lo:
        return Finding("level", "ok", f"below the published range: {text}", evidence, strength=strength)
    else:
        return Finding("level", "ok", f"within the published range: {text}", evidence, strength=strength)
    summary = f"above the published range: {text}" + (f" (stale rollouts: {why})" if stale else "")
    evidence["examples"] = examples(pairs, pl.col("d").abs())
    fix = (
        "serve the engine in the trainer's precision (bf16/fp32 lm_head, same kernels) or correct with "
        "truncated IS (TIS/MIS)"
    )
    return Finding("level", verdict, summary, evidence, fix, strength=strength)


def _staleness(inp: Inputs) -> dict | None:
    """{"rows", "fresh_rows", "stale_share" (weighted), "mean", "max"} of the per-token
    `staleness` column (weight updates behind π_old's weights); None without it."""
    if "staleness" not in inp.pairs.collect_schema().names():
        return None
    lag, w = pl.col("staleness").cast(pl.Float64), pl.col("w")
    got = collect(
        inp.pairs.filter(lag.is_not_null()).select(
            pl.len().alias("rows"),
            (lag == 0).sum().alias("fresh_rows"),
            ((w * (lag > 0)).sum() / w.sum()).alias("stale_share"),
            ((w * lag).sum() / w.sum()).alias("mean"),
            lag.max().alias("max"),
        )
    ).row(0, named=True)
    return got if got["rows"] else None


def drift_of(inp: Inputs) -> dict | None:
    """How the mismatch moved over the run and how far the policy moved: {"steps" (the
    per-step rows with k3), "third" (steps per third), "first", "last" (mean k3_kl of the first and
    the last third), "growth" (last / first), "move" (mean |log π − log π_old| at updates ≥ 1,
    nats; None without such rows), "move_rows", "lr" (config)}; None below MIN_STEPS steps."""
    steps = inp.per_step.filter(pl.col("k3_kl").is_not_null())
    if steps.height < MIN_STEPS:
        return None
    third = steps.height // 3
    first, last = steps["k3_kl"].head(third).mean(), steps["k3_kl"].tail(third).mean()
    first, last = float(first or 0.0), float(last or 0.0)  # type: ignore[arg-type]
    growth = last / first if first > 0 else (math.inf if last > 0 else 1.0)
    move = collect(
        inp.tokens.filter(pl.col("update") >= 1).select(
            (pl.col("pi_logp").cast(pl.Float64) - pl.col("old_logp").cast(pl.Float64)).abs().mean().alias("m"),
            pl.len().alias("n"),
        )
    ).row(0, named=True)
    return {
        "steps": steps,
        "third": third,
        "first": first,
        "last": last,
        "growth": growth,
        "move": move["m"],
        "move_rows": move["n"],
        "lr": inp.config.get("lr"),
    }


@check("engine_drift", kind="symptom", cadence="every", order=10)
def engine_drift_check(inp: Inputs) -> Finding:
    """1h. Mismatch not explained by training: it grows while π_old does not change.

    Statistic: g = mean k3_kl over the last third of the steps / over the first third, and the
    policy's movement: config lr = 0, or the mean |log π − log π_old| of the rows at updates ≥ 1
    (π has taken optimizer steps there) below 1e-6 nats. Threshold: g ≥ 4 (|Δ log p| doubling)
    with a static policy is a problem; g ≥ 4 where the movement cannot be told (no update ≥ 1
    rows, no lr) warns; a growth with a moving policy is training's (ok)."""
    evidence: dict = {"growth_at": DRIFT_GROWTH}
    drift = drift_of(inp)
    if drift is None:
        steps = inp.per_step.filter(pl.col("k3_kl").is_not_null()).height
        return Finding("engine_drift", "ok", f"too few steps ({steps}) to follow the mismatch", evidence)
    steps, third, first, last, growth = (drift[k] for k in ("steps", "third", "first", "last", "growth"))
    move, lr = {"m": drift["move"], "n": drift["move_rows"]}, drift["lr"]
    static = lr == 0 or (move["n"] > 0 and move["m"] is not None and move["m"] < STATIC_MOVE)
    unknown = lr is None and not move["n"]
    evidence |= {
        "k3_first_third": first,
        "k3_last_third": last,
        "growth": growth,
        "steps": [int(steps["step"][0]), int(steps["step"][-1])],
        "policy_move": move["m"],
        "lr": lr,
    }
    if growth < DRIFT_GROWTH:
        return Finding(
            "engine_drift",
            "ok",
            f"the mismatch does not grow on its own (k3 ×{growth:.2f} first → last third)",
            evidence,
        )
    if not static and not unknown:
        summary = (
            f"the mismatch grows ×{growth:.1f} while the policy trains (mean |Δ log π| {decimal(move['m'])} per "
            "update): training's"
        )
        return Finding("engine_drift", "ok", summary, evidence)
    verdict = "problem" if static else "warning"
    why = "lr = 0" if lr == 0 else ("π does not move at its updates" if static else "whether π moved is not recorded")
    summary = (
        f"the mismatch grows ×{growth:.1f} (k3 {decimal(first)} → {decimal(last)}) while {why}: "
        "the engine drifts, not the policy"
    )
    last_steps = inp.pairs.filter(pl.col("step") >= int(steps["step"][-third]))
    evidence["examples"] = examples(last_steps, pl.col("d").abs())
    fix = "check the engine's weight sync and cache (stale or partially synced weights, prefix cache across updates)"
    return Finding("engine_drift", verdict, summary, evidence, fix, strength=growth / DRIFT_GROWTH)


__all__ = ["DRIFT_GROWTH", "STATIC_MOVE", "drift_of", "engine_drift_check", "level_check", "where_check"]
