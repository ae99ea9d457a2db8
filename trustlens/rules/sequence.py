"""The per-response statistics of the sequence-level rules (docs/rules.md), written once for torch
tensors and numpy arrays.

A sequence rule decides every token of a response y from one number, its sequence ratio s, built
from the per-token log-ratios of the rule's policy (π, or π_old) to its anchor (μ, or π_old):

    statistic "sum"   log s = Σ_{t∈y} log(policy/anchor)(a_t)          (the product of the ratios)
    statistic "mean"  log s = (1/|y|) Σ_{t∈y} log(policy/anchor)(a_t)  (their geometric mean)

Every such sum follows from three per-response numbers, which the recorder stores on each token
row so that a sampled run decides these rules exactly (docs/run-format.md):

    seq_logratio_mu   Σ_t log(π/μ)(a_t)      (π/π_old in a run recorded without μ, as `ratio`)
    seq_logratio_old  Σ_t log(π/π_old)(a_t)  (null without π_old)
    seq_tokens        |y|, the response's token count

so Σ log(π_old/μ) = seq_logratio_mu − seq_logratio_old (`sequence_statistics`: what the recorder
stores and what `TokenInputs` computes on tensors). The rule then blocks as a token rule does,
with d = |s − 1| and the direction of s against 1. Imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from trustlens.rules.rule import Rule

# The token columns of a recorded run that hold the per-response statistics, and what each holds.
SEQUENCE_COLUMNS = {
    "seq_logratio_mu": "Σ log(π/μ) over the response (π/π_old when μ is absent), nats",
    "seq_logratio_old": "Σ log(π/π_old) over the response, nats",
    "seq_tokens": "the response's token count",
}


def statistic_columns(rule: Rule) -> tuple[str, ...]:
    """The per-response columns a sequence rule (or a sequence weight) reads."""
    sums = []
    if rule.anchor == "mu":
        sums.append("seq_logratio_mu")
    if rule.anchor == "old" or rule.policy == "old" or rule.weight == "seq_tis":
        sums.append("seq_logratio_old")
    return (*sums, "seq_tokens")


def sequence_statistics(
    pi_logp: Any,  # log π(a_t) per token, float64 (torch tensor or numpy array)
    anchor_logp: Any,  # log μ(a_t) per token, float64 (log π_old(a_t) in a call without μ)
    old_logp: Any | None,  # log π_old(a_t) per token, float64; None when not given
    over_response: Callable[[Any], Any],  # per-token values -> each row's sum over its response
    tokens: Any,  # each row's response token count |y|
) -> dict[str, Any]:
    """The per-response statistics of the module docstring, {"seq_logratio_mu",
    "seq_logratio_old" (None without π_old), "seq_tokens"}, each `over_response` of the token
    log-ratios: the one definition, which the recorder (numpy rows grouped by sample) and
    `TokenInputs` ((B, T) tensors under a response mask) call with their own sum. A token where
    both log-probs are −inf makes its response's sum NaN (a response no policy can produce); one
    −inf makes it ±inf."""
    with np.errstate(invalid="ignore"):  # −inf − (−inf) = NaN, on numpy arrays
        return {
            "seq_logratio_mu": over_response(pi_logp - anchor_logp),
            "seq_logratio_old": None if old_logp is None else over_response(pi_logp - old_logp),
            "seq_tokens": tokens,
        }


def sequence_log_ratio(rule: Rule, statistic: Callable[[str], Any]) -> Any:
    """log s of `rule` per row (module docstring) from the per-response statistics:
    `statistic(name)` gives the column `name` (float64 arrays of one shape); only those of
    `statistic_columns(rule)` are read."""
    reads = statistic_columns(rule)

    def read(name: str) -> Any:
        return statistic(name) if name in reads else None

    sum_mu, sum_old, tokens = read("seq_logratio_mu"), read("seq_logratio_old"), read("seq_tokens")
    with np.errstate(invalid="ignore"):  # inf − inf = NaN (blocks nothing), on numpy arrays
        if rule.anchor == "old":
            total = sum_old
        elif rule.policy == "old":
            total = sum_mu - sum_old  # Σ log(π_old/μ)
        else:
            total = sum_mu
        return total / tokens if rule.statistic == "mean" else total


__all__ = ["SEQUENCE_COLUMNS", "sequence_log_ratio", "sequence_statistics", "statistic_columns"]
