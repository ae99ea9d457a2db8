"""Which trustlens rules a TRL run is recorded with: every rule TRL's tensors can decide, and
the rule (with its thresholds) that reproduces the loss a GRPOConfig / DPPOConfig trains with."""

from __future__ import annotations

from typing import Any

from trustlens.integrations.active_rule import ActiveRule
from trustlens.rules import RULES

# TRL loss types whose clipped surrogate blocks exactly the tokens `minirl` blocks
_CLIPPED_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")

Thresholds = tuple[float | None, float | None]  # (low, high); None keeps the rule's default


def default_rules(
    active_rule: str | None = None, thresholds: Thresholds | None = None, *, topk: bool = False
) -> dict[str, Thresholds]:
    """{rule: (low, high)} for every rule TRL's tensors can decide — with topk=True (a top-K DPPO
    run) the top-K rules too — default thresholds except `thresholds` for `active_rule`."""
    inputs = {"old_logp", "response_mask", "topk_tv", "topk_kl"} if topk else {"old_logp", "response_mask"}
    rules: dict[str, Thresholds] = {name: (None, None) for name, rule in RULES.items() if set(rule.needs) <= inputs}
    if active_rule is not None and thresholds is not None:
        rules[active_rule] = thresholds
    return rules


def active_rule_of(args: Any) -> ActiveRule:
    """The trustlens rule TRL trains with under GRPOConfig `args`, with its (low, high); name None
    for a loss no rule reproduces (sapo, vespo). `importance_sampling_level="sequence"` (or
    "sequence_token") is GSPO: the clip of the geometric-mean ratio against π_old, `gspo`."""
    low = float(args.epsilon)
    high = float(args.epsilon_high if args.epsilon_high is not None else args.epsilon)
    divergence = getattr(args, "divergence_type", None)  # DPPOConfig: TRL's divergence mask vs μ
    if divergence is not None:
        return ActiveRule(f"dppo_{divergence}", low, high)
    level = getattr(args, "importance_sampling_level", "token")
    clipped = args.loss_type in _CLIPPED_LOSSES
    if level in ("sequence", "sequence_token") and clipped:
        return ActiveRule("gspo", low, high)
    if level != "token":
        return ActiveRule(None)
    if clipped:
        return ActiveRule("minirl", low, high)
    if args.loss_type == "cispo":  # TRL caps π/π_old at ε_high; trustlens' cispo never blocks
        return ActiveRule("cispo", None, max(high - 1.0, 0.0))
    return ActiveRule(None)
