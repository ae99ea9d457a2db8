"""The recorded sequence weight (`sequence_sum`): a sequence-level importance weight whose log is
the sum of the response's token log-ratios where it should be their mean.

A sequence weight (GSPO, sequence IS) is s = exp((1/|y|) Σ_t log ρ_t), the geometric mean of the
token ratios ρ. Written with the sum, log s grows with the response length |y|: a per-token
difference of −0.005 nats gives s = 0.61 on a 100-token response (trl #5814). The run holds what
decides it, per response: the weight the trainer applied (`seq_weight`, as it computed it) and
the per-response statistics `record` stores (docs/run-format.md): seq_logratio_mu = Σ log(π/μ),
seq_logratio_old = Σ log(π/π_old), seq_tokens = |y|.
"""

from __future__ import annotations

import polars as pl

from trustlens.analysis.buckets import collect
from trustlens.analysis.diagnosis.finding import Finding, verdict_of
from trustlens.analysis.diagnosis.inputs import Inputs, examples
from trustlens.analysis.diagnosis.registry import check

KEYS = ["step", "update", "rank", "sample"]  # one response at one update
SEPARATION = 1e-3  # responses whose sum and mean log-ratio differ by less (nats) cannot tell them apart
SUM_WARNING = 0.25  # share of those responses whose log weight is nearer the sum: warns ...
SUM_PROBLEM = 0.5  # ... and is a problem (a weight made with the sum gives ≈ 1, with the mean ≈ 0)
MIN_RESPONSES = 20


def _candidates(names: list[str]) -> dict[str, pl.Expr]:
    """The token log-ratio sums a sequence weight can be made of, by the ratio they sum."""
    mu, old = pl.col("seq_logratio_mu").cast(pl.Float64), pl.col("seq_logratio_old").cast(pl.Float64)
    out = {"π/μ": mu}
    if "seq_logratio_old" in names:
        out |= {"π_old/μ": mu - old, "π/π_old": old}
    return out


def sum_share(inp: Inputs) -> dict | None:
    """Over the responses with a recorded `seq_weight` and |y| ≥ 2, for the ratio whose mean or
    sum explains log seq_weight best: {"ratio", "responses" (those whose sum and mean differ by
    ≥ SEPARATION), "share_nearer_sum", "median_residual" (nats, to the nearer of the two),
    "median_length", "median_log_weight_over_mean" (≈ |y| for a sum, 1 for a mean)}; None without
    the columns or below MIN_RESPONSES responses."""
    names = inp.tokens.collect_schema().names()
    if not {"seq_weight", "seq_logratio_mu", "seq_tokens"} <= set(names):
        return None
    sums = _candidates(names)
    responses = (
        inp.tokens.filter(pl.col("seq_weight").is_not_null() & (pl.col("seq_weight") > 0) & (pl.col("seq_tokens") >= 2))
        .group_by(KEYS)
        .agg(
            pl.col("seq_weight").first().cast(pl.Float64).log().alias("log_w"),
            pl.col("seq_tokens").first().cast(pl.Float64).alias("n"),
            *(s.first().alias(name) for name, s in sums.items()),
        )
    )
    best: dict | None = None
    for name in sums:
        total, mean, log_w = pl.col(name), pl.col(name) / pl.col("n"), pl.col("log_w")
        to_sum, to_mean = (log_w - total).abs(), (log_w - mean).abs()
        stats = collect(
            responses.filter(total.is_finite() & ((total - mean).abs() >= SEPARATION)).select(
                pl.len().alias("responses"),
                (to_sum < to_mean).mean().alias("share_nearer_sum"),
                pl.min_horizontal(to_sum, to_mean).median().alias("median_residual"),
                pl.col("n").median().alias("median_length"),
                (log_w / mean).median().alias("median_log_weight_over_mean"),
            )
        ).row(0, named=True)
        if stats["responses"] >= MIN_RESPONSES and (best is None or stats["median_residual"] < best["median_residual"]):
            best = {"ratio": name, **stats}
    return best


@check("sequence_sum", kind="cause", cadence="early", order=60)
def sequence_sum_check(inp: Inputs) -> Finding:
    """A sequence weight made with the sum of the token log-ratios instead of their mean.

    Statistic (`sum_share`), over the responses whose sum and mean log-ratio differ by ≥ 1e-3
    nats, for the ratio (π/μ, π_old/μ or π/π_old) whose sum or mean is nearest log seq_weight:
    q = the share of responses whose log weight is nearer the sum; the median of
    log seq_weight / mean log-ratio (≈ |y| for a sum: the weight scales with the length) in the
    evidence. Threshold: q ≥ 0.25 warns, ≥ 0.5 is a problem (a sum gives q ≈ 1, a mean q ≈ 0).
    A run without `seq_weight` (the weight the trainer applied) is ok, saying so."""
    stats = sum_share(inp)
    evidence: dict = {"warning_at": SUM_WARNING, "problem_at": SUM_PROBLEM, "separation": SEPARATION}
    if stats is None:
        summary = "no sequence weight recorded to check (record(seq_weight=...), the weight the trainer applied)"
        return Finding("sequence_sum", "ok", summary, evidence)
    evidence |= stats
    q = float(stats["share_nearer_sum"])
    verdict = verdict_of(q, SUM_WARNING, SUM_PROBLEM)
    measured = (
        f"log seq_weight is nearer the sum of the token log-ratios log({stats['ratio']}) than their mean on {q:.1%} "
        f"of {stats['responses']} responses (median residual {stats['median_residual']:.2e} nats; log weight / "
        f"mean log-ratio {stats['median_log_weight_over_mean']:.1f} at a median length of "
        f"{stats['median_length']:.0f} tokens)"
    )
    if verdict == "ok":
        return Finding("sequence_sum", "ok", f"the sequence weight averages the log-ratios: {measured}", evidence)
    summary = f"{measured}: the sequence weight sums the log-ratios, so it scales with the response length"
    ratio = _candidates(inp.tokens.collect_schema().names())[stats["ratio"]]
    off = (pl.col("seq_weight").cast(pl.Float64).log() - ratio / pl.col("seq_tokens")).abs()
    evidence["examples"] = examples(inp.pairs.filter((pl.col("pos") == 0) & pl.col("seq_weight").is_not_null()), off)
    fix = (
        "average the token log-ratios over the response (log s = (1/|y|) Σ log ρ_t: GSPO, sequence IS) instead of "
        "summing them, or divide the sum by the response's token count"
    )
    return Finding("sequence_sum", verdict, summary, evidence, fix, strength=q / SUM_PROBLEM)


__all__ = ["sequence_sum_check", "sum_share"]
