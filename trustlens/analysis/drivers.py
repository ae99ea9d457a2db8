"""The tokens and samples that drove a collapse alert (`trustlens.analysis.collapse`).

Driving tokens, at the alert's first step, ranked by a score (highest first): entropy alerts the
tokens of lowest (collapse) or highest (surge) entropy; mismatch_growth |log μ − log π_old|;
grad_norm_spike |A|·π/μ; reward_drop and accuracy_drop the tokens of negative-advantage samples
pushed down the furthest, |A|·max(μ − π, 0) (over-updates on negative samples, the paper's
collapse driver);
blocked_drift the active rule's blocked tokens with the largest binary TV |π − μ|. Samples are
ranked by the mean score of their tokens (reward_drop and accuracy_drop: lowest reward first).
"""

from __future__ import annotations

import polars as pl

from trustlens.analysis.buckets import collect


def alert_drivers(run, ep: dict, top_tokens: int, top_samples: int) -> tuple[list[int], list[dict]]:
    """The ids of the `top_samples` samples and the (sample, update, pos) of the `top_tokens`
    tokens at the alert's first step that drove it, strongest first. `ep` has the alert's
    step, kind and signal (`trustlens.analysis.collapse.ALERT_SCHEMA`)."""
    step = ep["step"]
    tokens = run.tokens.filter(pl.col("step") == step)
    kind, signal = ep["kind"], ep["signal"]
    mu, pi = pl.col("mu_logp").cast(pl.Float64), pl.col("pi_logp").cast(pl.Float64)
    if kind in ("reward_drop", "accuracy_drop"):
        worst = collect(run.samples.filter(pl.col("step") == step).sort("reward", "sample").head(top_samples))
        samples = worst["sample"].to_list()
        # over-updates on negative samples: A < 0 tokens whose probability fell furthest below μ
        tokens = tokens.filter(pl.col("advantage") < 0)
        score = pl.col("advantage").abs().cast(pl.Float64) * (mu.exp() - pi.exp()).clip(lower_bound=0.0)
    elif kind in ("entropy_collapse", "entropy_surge"):
        score = pl.col("entropy") * (1 if kind == "entropy_surge" else -1)
        samples = None
    elif kind == "mismatch_growth":
        score = (mu - pl.coalesce(pl.col("old_logp"), pl.col("pi_logp")).cast(pl.Float64)).abs()
        samples = None
    elif kind == "grad_norm_spike":
        # the policy-gradient weight |A| · π/μ of the tokens the update did not block
        score = (pl.col("advantage").abs() * pl.col("ratio")).cast(pl.Float64)
        samples = None
    else:  # blocked_drift: the blocked tokens that moved furthest
        tokens = tokens.filter(pl.col(signal))
        score = pl.col("binary_tv").cast(pl.Float64)
        samples = None
    scored = tokens.select("sample", "update", "pos", score.alias("score")).filter(pl.col("score").is_not_null())
    top = collect(
        scored.sort(["score", "sample", "update", "pos"], descending=[True, False, False, False]).head(top_tokens)
    )
    if samples is None:
        per_sample = collect(
            scored.group_by("sample")
            .agg(pl.col("score").mean())
            .sort(["score", "sample"], descending=[True, False])
            .head(top_samples)
        )
        samples = per_sample["sample"].to_list()
    return samples, top.select("sample", "update", "pos").to_dicts()


__all__ = ["alert_drivers"]
