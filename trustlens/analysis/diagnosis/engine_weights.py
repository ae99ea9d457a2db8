"""Checks that the engine serves the trainer's weights: μ drifting from π_old while π does not
move (`frozen_policy`), and a step in the mismatch at a resume that stays (`resume`).

Both rest on one property of a weight difference: it is systematic. An engine that serves other
weights than the trainer's gives the same token the same error each time it is scored, where
numerical noise (precision, kernels, a noisier engine) gives each scoring its own. The share of
the variance of d = log μ − log π_old (nats) that the token id explains, over the steps in
question, tells them apart: ω² of a one-way analysis of variance of d by token id (weighted by
the rows' sampling weights), ≈ 0 for noise of any size, large for a weight difference.
"""

from __future__ import annotations

import math

import polars as pl

from trustlens.analysis.buckets import collect
from trustlens.analysis.diagnosis.finding import Finding
from trustlens.analysis.diagnosis.inputs import Inputs, examples
from trustlens.analysis.diagnosis.level import DRIFT_GROWTH, STATIC_MOVE, drift_of
from trustlens.analysis.diagnosis.registry import check
from trustlens.core.numbers import decimal

SYSTEMATIC_WARNING = 0.05  # ω² of d by token id at which the mismatch counts as a weight difference (warning)
SYSTEMATIC_PROBLEM = 0.1  # ... and a problem (noise gives ω² ≈ 0; a per-id logit offset 0.2 and more)
EXPLAIN = 10.0  # π's movement per update explains a growth of mean |d| up to EXPLAIN times itself
MIN_ROWS = 200  # fewer rows in the steps judged: ω² cannot be told
RESUME_WINDOW = 3  # steps before a resume, right after it, and at the end of the run, that are compared
RESUME_WARNING = 2.0  # k3 after / before the resume that warns ...
RESUME_PROBLEM = 4.0  # ... and that is a problem (|Δ log p| doubling), right after it and still at the end

_FIX = (
    "make the engine serve the trainer's weights: check the weight sync (every tensor, every rank, after every "
    "update) and, with LoRA, that the engine gets the adapter merged exactly once (or serves it unmerged) "
    "instead of the base weights or an adapter merged again at every sync"
)


def systematic_share(pairs: pl.LazyFrame) -> tuple[float | None, int]:
    """(ω², rows): the share of the variance of d that the token id explains, ω² =
    (SS_between − (k − 1)·MS_within) / (SS_total + MS_within) over the k token ids of `pairs`
    (weighted sums; None below MIN_ROWS rows or without spread)."""
    w, d = pl.col("w"), pl.col("d")
    total = collect(pairs.select(pl.len().alias("n"), w.sum().alias("sw"), (w * d).sum().alias("swd"))).row(
        0, named=True
    )
    n = int(total["n"])
    if n < MIN_ROWS or not total["sw"]:
        return None, n
    mean = total["swd"] / total["sw"]
    per_id = collect(
        pairs.group_by("token_id").agg(
            w.sum().alias("sw"), ((w * d).sum() / w.sum()).alias("m"), (w * (d - mean) ** 2).sum().alias("ss")
        )
    )
    ss_total = float(per_id["ss"].sum())
    ss_between = float((per_id["sw"] * (per_id["m"] - mean) ** 2).sum())
    k = per_id.height
    if ss_total <= 0 or n <= k:
        return None, n
    ms_within = (ss_total - ss_between) / (n - k) * (n / float(total["sw"]))  # per unit weight
    return (ss_between - (k - 1) * ms_within) / (ss_total + ms_within), n


def updates_behind(inp: Inputs, from_step: int) -> tuple[float, str | None]:
    """(u, why in words): how many weight updates the engine's weights are behind π_old's from
    `from_step` on, by design: the weighted mean of the per-token `staleness` column there, else
    config rollout_lag k steps × the updates of a step (minibatches × epochs); (0, None) for a
    fresh engine."""
    if "staleness" in inp.pairs.collect_schema().names():
        lag = pl.col("staleness").cast(pl.Float64)
        rows = inp.pairs.filter((pl.col("step") >= from_step) & lag.is_not_null())
        mean = collect(rows.select((pl.col("w") * lag).sum() / pl.col("w").sum())).item()
        if mean is not None and mean > 0:
            return float(mean), "the per-token staleness column"
    lag_steps = inp.config_count("rollout_lag")
    if lag_steps is not None:
        per_step = (inp.config_count("minibatches") or 1) * (inp.config_count("epochs") or 1)
        return float(lag_steps * per_step), f"rollout_lag {lag_steps} steps of {per_step} updates"
    return 0.0, None


@check("frozen_policy", kind="cause", cadence="every", order=80)
def frozen_policy_check(inp: Inputs) -> Finding:
    """μ drifts from π_old while π does not move: the engine's weights change, not the policy's.

    Statistics: g = mean k3 over the last third of the steps / the first third (`drift_of`, as
    engine_drift); the policy's movement m = mean |log π − log π_old| at updates ≥ 1, static
    when config lr = 0 or m < 1e-6 nats, and too small to explain the drift when max(1, u)·m is
    below 1/10 of the growth of mean |d| between the thirds, u the updates μ's weights are behind
    π_old's by design (`updates_behind`: a stale engine's d is the policy's movement over the lag,
    itself a weight difference); ω² of d by token id over the last third
    (`systematic_share`). Threshold: g ≥ 4 with a static or too-small movement and ω² ≥ 0.05
    warns, ω² ≥ 0.1 is a problem; g ≥ 4 with ω² ≥ 0.1 where the movement is not recorded warns.
    A drift of noise (ω² ≈ 0) is engine_drift's; a growth the policy's movement explains is
    training's."""
    evidence: dict = {"growth_at": DRIFT_GROWTH, "warning_at": SYSTEMATIC_WARNING, "problem_at": SYSTEMATIC_PROBLEM}
    drift = drift_of(inp)
    if drift is None:
        return Finding("frozen_policy", "ok", "too few steps to follow the mismatch", evidence)
    steps, third, growth, move, lr = (drift[k] for k in ("steps", "third", "growth", "move", "lr"))
    first_step, last_step = int(steps["step"][third - 1]), int(steps["step"][-third])
    abs_d = collect(
        inp.pairs.select(
            *(
                ((pl.col("w") * pl.col("d").abs()).filter(keep).sum() / pl.col("w").filter(keep).sum()).alias(name)
                for name, keep in (("first", pl.col("step") <= first_step), ("last", pl.col("step") >= last_step))
            )
        )
    ).row(0, named=True)
    grown = max(0.0, float(abs_d["last"] or 0.0) - float(abs_d["first"] or 0.0))
    share, rows = systematic_share(inp.pairs.filter(pl.col("step") >= last_step))
    evidence |= {"growth": growth, "policy_move": move, "lr": lr, "mean_abs_d_growth": grown}
    evidence |= {"systematic_share": share, "rows": rows, "steps": [int(steps["step"][0]), int(steps["step"][-1])]}
    behind, stale = updates_behind(inp, last_step)
    evidence |= {"updates_behind": behind, "stale": stale}
    lagged = f" over the {decimal(behind)} updates μ's weights are behind ({stale})" if stale else ""
    if lr == 0 or (move is not None and move < STATIC_MOVE):
        still = "lr = 0" if lr == 0 else f"π does not move at its updates (mean |Δ log π| {decimal(move)} nats)"
    elif move is not None and move * max(1.0, behind) * EXPLAIN < grown:
        still = f"π moves {decimal(move)} nats per update{lagged}, too little to explain it"
    else:
        still = None
    unknown = lr is None and move is None
    if growth < DRIFT_GROWTH or share is None or (still is None and not unknown):
        why = "the mismatch does not grow" if growth < DRIFT_GROWTH else f"the policy's movement{lagged} explains it"
        if share is None and growth >= DRIFT_GROWTH:
            why = f"too few rows ({rows}) in the last steps to tell a weight difference"
        return Finding("frozen_policy", "ok", f"no drift of the engine's weights: {why} (k3 ×{growth:.2f})", evidence)
    if still is None:  # whether π moved is not recorded
        verdict = "warning" if share >= SYSTEMATIC_PROBLEM else "ok"
        still = "whether π moved is not recorded"
    else:
        verdict = "problem" if share >= SYSTEMATIC_PROBLEM else ("warning" if share >= SYSTEMATIC_WARNING else "ok")
    measured = f"the mismatch grows ×{growth:.1f} (k3, first → last third) while {still}"
    if verdict == "ok":
        summary = f"{measured}, but the token id explains only {share:.1%} of it: noise, not other weights"
        return Finding("frozen_policy", "ok", summary, evidence)
    summary = (
        f"{measured}; the token id explains {share:.0%} of log μ − log π_old in the last steps, as a weight "
        "difference does: the engine's weights move away from the trainer's (stale weight sync or an unmerged "
        "adapter)"
    )
    evidence["examples"] = examples(inp.pairs.filter(pl.col("step") >= last_step), pl.col("d").abs())
    return Finding("frozen_policy", verdict, summary, evidence, _FIX, strength=share / SYSTEMATIC_PROBLEM)


def _resume_points(inp: Inputs) -> list[int]:
    """The last step recorded before each resume (run.json `resumed_after`, nulls dropped)."""
    after = inp.manifest.get("resumed_after")
    return [int(s) for s in after if isinstance(s, int) and not isinstance(s, bool)] if isinstance(after, list) else []


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _jump(after: float, before: float) -> float:
    return after / before if before > 0 else (math.inf if after > 0 else 1.0)


@check("resume", kind="cause", cadence="every", order=70)
def resume_check(inp: Inputs) -> Finding:
    """A step change in the mismatch right after a resume that stays: the engine did not receive
    the resumed weights.

    Statistics, at each resume point of run.json (`resumed_after`, the last step before it):
    j = median k3 of the first RESUME_WINDOW steps after it / of the RESUME_WINDOW steps before
    it, and j_end = the same of the run's last RESUME_WINDOW steps after it (does the step stay),
    over ≥ 2 steps on each side; ω² of d by token id after it in the evidence. Threshold: j ≥ 2
    and j_end ≥ 2 warns, j ≥ 4 and j_end ≥ 4 is a problem; a step that falls back (j ≥ 4,
    j_end < 2) warns. No resume point: ok."""
    points = _resume_points(inp)
    evidence: dict = {"resumed_after": points, "warning_at": RESUME_WARNING, "problem_at": RESUME_PROBLEM}
    if not points:
        return Finding("resume", "ok", "no resume recorded (run.json resumed_after)", evidence)
    per_step = inp.per_step.filter(pl.col("k3_kl").is_not_null())
    k3 = dict(zip(per_step["step"].to_list(), per_step["k3_kl"].to_list(), strict=True))
    judged = []
    for point in points:
        before = [k3[s] for s in sorted(s for s in k3 if s <= point)[-RESUME_WINDOW:]]
        later = sorted(s for s in k3 if s > point)
        if len(before) < 2 or len(later) < 2:
            continue
        right_after = _jump(_median([k3[s] for s in later[:RESUME_WINDOW]]), _median(before))
        at_end = _jump(_median([k3[s] for s in later[-RESUME_WINDOW:]]), _median(before))
        judged.append({"after_step": point, "resumed_at": later[0], "jump": right_after, "jump_at_end": at_end})
    evidence["points"] = judged
    if not judged:
        return Finding("resume", "ok", f"too few steps around the resume points {points} to compare", evidence)
    worst = max(judged, key=lambda p: min(p["jump"], p["jump_at_end"]))
    j, j_end, at = worst["jump"], worst["jump_at_end"], worst["resumed_at"]
    if j >= RESUME_PROBLEM and j_end >= RESUME_PROBLEM:
        verdict = "problem"
    elif (j >= RESUME_WARNING and j_end >= RESUME_WARNING) or j >= RESUME_PROBLEM:
        verdict = "warning"
    else:
        return Finding("resume", "ok", f"no step in the mismatch at the resume (step {at}: k3 ×{j:.2f})", evidence)
    share, _ = systematic_share(inp.pairs.filter(pl.col("step") >= at))
    evidence["systematic_share"] = share
    stays = "and stays there" if j_end >= RESUME_WARNING else f"then falls back (×{j_end:.1f} at the end)"
    summary = (
        f"the mismatch steps up ×{j:.1f} (k3) right after the resume at step {at} {stays}"
        + (f"; the token id explains {share:.0%} of it, as a weight difference does" if share else "")
        + ": the engine did not receive the resumed weights"
    )
    evidence["examples"] = examples(inp.pairs.filter(pl.col("step") >= at), pl.col("d").abs())
    fix = (
        "after resuming, sync the loaded checkpoint's weights to the engine before the first rollout (and, with "
        "LoRA, the adapter too), or restart the engine from that checkpoint"
    )
    return Finding("resume", verdict, summary, evidence, fix, strength=min(j, j_end) / RESUME_PROBLEM)


__all__ = ["frozen_policy_check", "resume_check", "systematic_share", "updates_behind"]
