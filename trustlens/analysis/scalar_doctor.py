"""The doctor's checks that need only per-step scalars, for a run that holds only metrics
(imported: `trustlens import`; trustlens.analysis.collapse.logged): the token-level checks of
`trustlens.analysis.diagnosis` need per-token log-probabilities such a run does not have.

    level      the logged mismatch against the model kind's published range (the doctor's 1g,
               trustlens.analysis.diagnosis.level.level_check): k3_kl (or K1, mismatch_kl,
               where only that was logged) and prob_diff_mean, each the mean over the steps that
               logged it (a mean of step means, not token-weighted: the token counts are not
               logged). Thresholds as 1g: k3 above the range's upper end or prob_diff_mean above
               PROB_DIFF_WARNING warns; k3 over K3_PROBLEM_FACTOR× the upper end is a problem,
               a warning when the log shows stale rollouts.
    staleness  a hint, in the level finding: a logged metric whose name speaks of staleness or
               off-policy lag (STALE_NAMES) is reported with its mean, and an above-range level
               says the mismatch then includes the staleness (the hook's per-token `staleness`
               column separates them: docs/doctor.md).
"""

from __future__ import annotations

import math
import re

import polars as pl

from trustlens.analysis.collapse.levels import model_kind
from trustlens.analysis.collapse.logged import NO_TOKENS, logged_signals
from trustlens.analysis.diagnosis.finding import Finding
from trustlens.analysis.diagnosis.level import K3_PROBLEM_FACTOR, K3_RANGE, PROB_DIFF_WARNING
from trustlens.core.numbers import decimal

# names of logged metrics that measure how stale the rollouts are (off-policy lag, async level)
STALE_NAMES = re.compile(r"stale|staleness|off_policy|offpolicy|async_level|policy_lag|version_lag", re.IGNORECASE)


def _mean(values: pl.Series) -> float | None:
    finite = [v for v in values.to_list() if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def staleness_metrics(run) -> dict[str, float]:
    """{name: mean over steps} of the logged metrics STALE_NAMES matches."""
    metrics = run.metrics.select("name", "value").collect()
    stale = metrics.filter(pl.col("name").map_elements(lambda n: bool(STALE_NAMES.search(n)), pl.Boolean))
    return {n: float(v) for n, v in stale.group_by("name").agg(pl.col("value").mean()).sort("name").rows()}


def scalar_findings(run) -> list[Finding]:
    """The level finding of a metrics-only run (module docstring), with the staleness hint."""
    signals = logged_signals(run)
    kind = model_kind(run)
    lo, hi = K3_RANGE.get(kind, K3_RANGE["dense"])
    k3, pdm = _mean(signals["k3_kl"]), _mean(signals["prob_diff_mean"])
    stale = staleness_metrics(run)
    evidence: dict = {"model_kind": kind, "k3_range": [lo, hi], "k3_kl": k3, "prob_diff_mean": pdm, "note": NO_TOKENS}
    evidence["prob_diff_warning"] = PROB_DIFF_WARNING
    if stale:
        evidence["staleness"] = stale
    if k3 is None and pdm is None:
        return [Finding("level", "ok", "no mismatch metric logged (k3_kl, mismatch_kl or prob_diff_mean)", evidence)]
    parts = []
    if k3 is not None:
        parts.append(f"k3 {decimal(k3)} ({kind} range {lo:g}–{hi:g})")
    if pdm is not None:
        parts.append(f"prob_diff_mean {decimal(pdm)}")
    text = ", ".join(parts) + " (means over the logged steps)"
    strength = (k3 or 0.0) / (K3_PROBLEM_FACTOR * hi)
    hint = ", ".join(f"{n} {decimal(v)}" for n, v in stale.items())
    if strength >= 1:
        verdict = "warning" if stale else "problem"
    elif (k3 is not None and k3 > hi) or (pdm is not None and pdm > PROB_DIFF_WARNING):
        verdict = "warning"
    else:
        where = "below" if k3 is not None and k3 < lo else "within"
        return [Finding("level", "ok", f"{where} the published range: {text}", evidence, strength=strength)]
    summary = f"above the published range: {text}"
    summary += (
        f"; the log shows stale rollouts ({hint}): part of it is the staleness"
        if stale
        else "; if rollouts came from older weights (async training), part of it is the staleness"
    )
    fix = (
        "serve the engine in the trainer's precision (bf16/fp32 lm_head, same kernels) or correct with truncated IS "
        "(TIS/MIS); record with the hook (with the engine's weight version) to tell staleness from precision"
    )
    return [Finding("level", verdict, summary, evidence, fix, strength=strength)]


__all__ = ["STALE_NAMES", "scalar_findings", "staleness_metrics"]
