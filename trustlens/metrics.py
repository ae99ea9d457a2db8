"""The one registry of metric names: every per-step number trustlens logs or computes.

A metric has one name, used verbatim as the trainer's logged name (`metrics/` of a run), as the
column of the analysis frames (`trustlens.analysis`), and as the dashboard's label. Its entry
states the unit and the definition, and the name verl logs for the same quantity where verl has
one (verl's `rollout_corr/*` metrics of `verl/trainer/ppo/rollout_corr_helper.py`, and the
`training/rollout_*` debug metrics of `verl/utils/debug/metrics.py`).

Notation: per generated token a_t, μ = μ(a_t) the rollout engine's probability, π_old =
π_old(a_t) the trainer's recomputation before the step's first update, ρ = π_old/μ. Means are
over the response tokens of a step (token mean) unless the entry says "over sequences".

Names with a `<rule>` or `<sign>` part are templates: `blocked_rate(rule, sign)` fills them in.
Signs are `pos` (A > 0) and `neg` (A < 0); a token with A = 0 is never blocked, so block rates
are over A ≠ 0 tokens and the A = 0 share is its own metric (`zero_adv_frac`).

This module imports neither torch nor polars.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One metric: its name, unit, definition and verl's name for the same quantity."""

    name: str  # the one name: logged name, analysis column, dashboard label
    unit: str  # "nats", "probability", "fraction", "ratio", "seconds", ...
    doc: str  # one line: the definition
    verl: str | None = None  # verl's logged name for the same quantity, None when verl has none


_ALL = (
    # training-inference mismatch, μ vs π_old on the sampled tokens (trustlens.analysis.mismatch)
    Metric(
        "mismatch_kl",
        "nats",
        "mean(log μ − log π_old): K1 estimate of KL(μ ‖ π_old); can be negative on a finite sample",
        "rollout_corr/kl",
    ),
    Metric("k3_kl", "nats", "mean(ρ − 1 − log ρ): K3 estimate of KL(μ ‖ π_old), never negative", "rollout_corr/k3_kl"),
    Metric(
        "log_ppl_diff",
        "nats",
        "mean over sequences of mean_t(log μ − log π_old) = log PPL(π_old) − log PPL(μ)",
        "rollout_corr/log_ppl_diff",
    ),
    Metric(
        "log_ppl_abs_diff",
        "nats",
        "mean over sequences of |mean_t(log μ − log π_old)|",
        "rollout_corr/log_ppl_abs_diff",
    ),
    Metric(
        "chi2_token",
        "ratio",
        "mean(ρ²) − 1, log ρ clamped to ±20 before exp: token-level χ²(π_old ‖ μ)",
        "rollout_corr/chi2_token",
    ),
    Metric(
        "chi2_seq",
        "ratio",
        "mean over sequences of (Π_t ρ_t)² − 1, Σ_t log ρ_t clamped to ±20 before exp",
        "rollout_corr/chi2_seq",
    ),
    Metric(
        "prob_diff_mean",
        "probability",
        "mean |π_old − μ| (the binary TV of μ and π_old)",
        "training/rollout_probs_diff_mean",
    ),
    Metric("prob_diff_max", "probability", "max |π_old − μ|", "training/rollout_probs_diff_max"),
    Metric(
        "prob_pearson",
        "correlation",
        "Pearson correlation of μ and π_old over the step's tokens",
        "training/rollout_actor_probs_pearson_corr",
    ),
    # mismatch over μ's top-K set, needs the trainer's logits (built-in trainer only)
    Metric(
        "topk_tv_mean", "probability", "mean of the per-token top-K TV between μ and π_old (topk_tv, docs/rules.md)"
    ),
    Metric("topk_tv_max", "probability", "max of the per-token top-K TV between μ and π_old"),
    Metric("topk_kl_mean", "nats", "mean of the per-token top-K KL(μ ‖ π_old) (topk_kl); +inf when π_old gives 0"),
    # trust-region rules
    Metric(
        "blocked/<rule>/<sign>",
        "fraction",
        "share of the step's tokens with advantage sign <sign> (pos: A > 0, neg: A < 0) that <rule> blocks",
    ),
    Metric("blocked/active", "fraction", "share of A ≠ 0 tokens the run's active rule blocked, mean over updates"),
    Metric("blocked_frac", "fraction", "blocked / count over A ≠ 0 tokens where the rule was evaluated (analysis)"),
    Metric("zero_adv_frac", "fraction", "share of tokens with A = 0: no gradient, never blocked, not in block rates"),
    # policy and training
    Metric("entropy", "nats", "mean entropy of π over the step's recorded tokens (analysis)"),
    Metric("entropy/mean", "nats", "mean entropy of π_old over the step's response tokens (trainer)", "actor/entropy"),
    Metric("reward/mean", "reward", "mean reward of the step's responses", "critic/rewards/mean"),
    Metric("reward/std", "reward", "standard deviation of the step's rewards"),
    Metric("response_length/mean", "tokens", "mean response length", "response_length/mean"),
    Metric("grad_norm", "norm", "gradient norm before clipping, mean over the step's updates", "actor/grad_norm"),
    Metric("eval/accuracy", "fraction", "held-out accuracy, greedy decoding"),
    Metric("eval/accuracy_sampled", "fraction", "held-out accuracy, one sample per problem at τ"),
    Metric("time/step", "seconds", "wall time of the step"),
    Metric("time/rollout", "seconds", "wall time of the step's rollout"),
    Metric("time/eval", "seconds", "wall time of the evaluation"),
)

METRICS: dict[str, Metric] = {m.name: m for m in _ALL}

# The per-step mismatch metrics of `trustlens.analysis.mismatch_per_step`, in column order.
MISMATCH_METRICS: tuple[str, ...] = (
    "mismatch_kl",
    "k3_kl",
    "log_ppl_diff",
    "log_ppl_abs_diff",
    "chi2_token",
    "chi2_seq",
    "prob_diff_mean",
    "prob_diff_max",
    "prob_pearson",
)

SIGNS = ("pos", "neg")


def _template(name: str) -> str:
    """The registry name of `name`: a filled-in template maps back to it."""
    return re.sub(r"^blocked/(?!active$)[^/]+/(pos|neg)$", "blocked/<rule>/<sign>", name)


def blocked_rate(rule: str, sign: str) -> str:
    """The logged name of `rule`'s block rate among tokens of advantage sign `sign` (pos or neg)."""
    if sign not in SIGNS:
        raise ValueError(f"sign must be one of {SIGNS} (A = 0 tokens are never blocked), got {sign!r}")
    if not rule or "/" in rule:
        raise ValueError(f"rule must be a non-empty name without '/', got {rule!r}")
    return f"blocked/{rule}/{sign}"


def metric(name: str) -> Metric:
    """The registry entry of `name` (a template such as blocked/<rule>/<sign> is resolved)."""
    try:
        return METRICS[_template(name)]
    except KeyError:
        raise KeyError(f"metric {name!r} is not in the registry trustlens.metrics.METRICS") from None


def describe(name: str) -> str:
    """One line for tooltips and docs: definition, unit and verl's name."""
    m = metric(name)
    verl = f"; verl: {m.verl}" if m.verl else ""
    return f"{m.doc} ({m.unit}{verl})"


__all__ = ["METRICS", "MISMATCH_METRICS", "SIGNS", "Metric", "blocked_rate", "describe", "metric"]
