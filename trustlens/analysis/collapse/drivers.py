"""The tokens and samples that drove a collapse alert (`trustlens.analysis.collapse`): the driver
score of each detector (its entry in `trustlens.analysis.collapse.detectors.DETECTORS` names it).

Driving tokens are the tokens at the alert's first step with the highest score (ties: lowest
sample, update, position first):

    alert                             ranked tokens                    score
    entropy_collapse / entropy_surge  all                              −entropy / entropy
    mismatch_growth                   all                              |log μ − log π_old|
    grad_norm_spike                   not blocked by the active rule   |A| · π/μ · (1 − π), if > 0
    reward_drop / accuracy_drop       A < 0                            |A| · max(μ − π, 0)
    blocked_drift                     blocked by the watched rule      |π − μ| (binary TV)

mismatch_growth: where a token has no π_old, its π stands in.
reward_drop and accuracy_drop: over-updates on negative samples, the tokens pushed furthest below
μ (the paper's collapse driver).

grad_norm_spike: the size of the token's gradient. A token's loss (`trustlens.rules.loss`,
docs/rules.md) is −A · sg(w) · (1 − blocked) · log π(a_t) with the importance weight w = π/μ
(the `ratio` column; π/π_old in a run without μ). Its gradient with respect to the position's
logits z (before the loss aggregation's common 1/N) is −A · w · (1 − blocked) · (e_{a_t} −
softmax(z)). On the logit of a_t it has size |A| · w · (1 − π), the score; its L2 norm lies
between the score and √2 times it, since the other logits' components, A · w · p_j, have
Σ_{j ≠ a_t} p_j² ≤ (1 − π)². So the tokens with no gradient are not listed: those the active
rule blocked are left out, and those with A = 0 or π = 1 (e.g. a forced `=` or `<eos>`) score 0.
The weight is the uncapped ratio: a loss that caps it (ppo's min(π/μ, C), cispo, grpo_tis, a
trainer's dual clip) gives a token at most the score. A run that does not name its active rule,
or has no blocked column for it, has no token left out as blocked.

Driving samples are the samples holding the ranked tokens, ranked by their strongest one: by
max_t score(t) over the sample's ranked tokens (ties: lowest sample id first), the order in which
the token ranking first reaches each sample. So the first driving samples hold the first driving
tokens, and a sample with no ranked token is never named: for reward_drop and accuracy_drop,
whose ranked tokens have A < 0, a sample with A = 0 (its whole group got the same reward: no
gradient) or A > 0 never is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl

from trustlens.analysis.buckets import collect
from trustlens.run import blocked_column

# A driver score: (run, the step's token rows, the watched signal) -> (the ranked rows, their score)
Score = Callable[[Any, pl.LazyFrame, str], tuple[pl.LazyFrame, pl.Expr]]

_MU, _PI = pl.col("mu_logp").cast(pl.Float64), pl.col("pi_logp").cast(pl.Float64)
_ADVANTAGE = pl.col("advantage").abs().cast(pl.Float64)


def pushed_below_mu(run, tokens: pl.LazyFrame, signal: str) -> tuple[pl.LazyFrame, pl.Expr]:
    """reward_drop / accuracy_drop: A < 0 tokens, |A| · max(μ − π, 0)."""
    return tokens.filter(pl.col("advantage") < 0), _ADVANTAGE * (_MU.exp() - _PI.exp()).clip(lower_bound=0.0)


def low_entropy(run, tokens: pl.LazyFrame, signal: str) -> tuple[pl.LazyFrame, pl.Expr]:
    """entropy_collapse: −entropy."""
    return tokens, -pl.col("entropy").cast(pl.Float64)


def high_entropy(run, tokens: pl.LazyFrame, signal: str) -> tuple[pl.LazyFrame, pl.Expr]:
    """entropy_surge: entropy."""
    return tokens, pl.col("entropy").cast(pl.Float64)


def log_gap(run, tokens: pl.LazyFrame, signal: str) -> tuple[pl.LazyFrame, pl.Expr]:
    """mismatch_growth: |log μ − log π_old| (π where π_old is null)."""
    return tokens, (_MU - pl.coalesce(pl.col("old_logp"), pl.col("pi_logp")).cast(pl.Float64)).abs()


def gradient_size(run, tokens: pl.LazyFrame, signal: str) -> tuple[pl.LazyFrame, pl.Expr]:
    """grad_norm_spike: tokens the active rule did not block, |A| · π/μ · (1 − π)."""
    return _unblocked(run, tokens), _ADVANTAGE * pl.col("ratio").cast(pl.Float64) * (1.0 - _PI.exp())


def blocked_moved(run, tokens: pl.LazyFrame, signal: str) -> tuple[pl.LazyFrame, pl.Expr]:
    """blocked_drift: the tokens the watched rule blocked, |π − μ| (binary TV)."""
    return tokens.filter(pl.col(signal)), pl.col("binary_tv").cast(pl.Float64)


def scored_tokens(run, step: int, signal: str, score: Score) -> pl.LazyFrame:
    """The tokens of `step` `score` ranks: columns sample, update, pos, score (Float64, never
    null; only positive scores, as a zero score has no pull)."""
    tokens, expr = score(run, run.tokens.filter(pl.col("step") == step), signal)
    scored = tokens.select("sample", "update", "pos", expr.alias("score")).filter(pl.col("score").is_not_null())
    return scored.filter(pl.col("score") > 0) if score is gradient_size else scored


def top_drivers(scored: pl.LazyFrame, top_tokens: int, top_samples: int) -> tuple[list[int], list[dict]]:
    """The ids of the `top_samples` samples and the (sample, update, pos) of the `top_tokens`
    tokens of `scored` (scored_tokens), strongest first (the module docstring's rules)."""
    top = collect(
        scored.sort(["score", "sample", "update", "pos"], descending=[True, False, False, False]).head(top_tokens)
    )
    ranked = scored.group_by("sample").agg(pl.col("score").max()).sort(["score", "sample"], descending=[True, False])
    samples = collect(ranked.head(top_samples))["sample"].to_list()
    return samples, top.select("sample", "update", "pos").to_dicts()


def _unblocked(run, tokens: pl.LazyFrame) -> pl.LazyFrame:
    """`tokens` without those the run's active rule blocked (a null decision is kept)."""
    rule = getattr(run, "active_rule", None)
    if rule is None or blocked_column(rule) not in tokens.collect_schema().names():
        return tokens
    return tokens.filter(~pl.col(blocked_column(rule)).fill_null(False))


__all__ = [
    "Score",
    "blocked_moved",
    "gradient_size",
    "high_entropy",
    "log_gap",
    "low_entropy",
    "pushed_below_mu",
    "scored_tokens",
    "top_drivers",
]
