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

so Σ log(π_old/μ) = seq_logratio_mu − seq_logratio_old. The rule then blocks as a token rule
does, with d = |s − 1| and the direction of s against 1. Imports no torch.
"""

from __future__ import annotations

from typing import Any

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


def sequence_log_ratio(rule: Rule, sum_mu: Any, sum_old: Any, tokens: Any) -> Any:
    """log s of `rule` per row from the per-response sums (module docstring); arrays of one shape
    (sum_mu or sum_old may be None where the rule does not read it)."""
    if rule.anchor == "old":
        total = sum_old
    elif rule.policy == "old":
        total = sum_mu - sum_old  # Σ log(π_old/μ)
    else:
        total = sum_mu
    return total / tokens if rule.statistic == "mean" else total


__all__ = ["SEQUENCE_COLUMNS", "sequence_log_ratio", "statistic_columns"]
