"""The registry of trust-region rules, the one place rules are listed: `register_rule` and the
rules of docs/rules.md it registers in `RULES`, one entry each with its paper in the docstring,
with their default thresholds (ratios for the "ratio" measure, probabilities for binary/top-K TV,
nats for the KLs): the token trust regions first, then the corrections beyond them
(`CORRECTIONS`: rules of another policy, per response, with a dual clip, or per batch); and the
look-up `get_rule` (a rule by name, refusing an unknown one with every registered name). `Rule`
itself is defined in trustlens.rules.rule, `resolve_rules` (the rules a caller names, with their
thresholds) in trustlens.rules.resolve; every name is importable from trustlens.rules. Imports no
torch.

A new rule is one entry here:

    @register_rule
    def my_rule() -> Rule:
        '''My rule (Author et al. 2026, "Title").'''
        return Rule("my_rule", 0.1, 0.1, "mu", "binary_tv", "one line for the docs, dashboard and CLI")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, overload

from trustlens.core.argument_checks import closest
from trustlens.rules.rule import Anchor, Measure, Policy, Rule, Sides, Statistic, WeightKind

# The built-in rules by name, in the order registered (docs/rules.md's order).
RULES: dict[str, Rule] = {}

_Entry = TypeVar("_Entry", Rule, Callable[[], Rule])


@overload
def register_rule(entry: Rule) -> Rule: ...
@overload
def register_rule(entry: Callable[[], Rule]) -> Callable[[], Rule]: ...
def register_rule(entry: _Entry) -> _Entry:
    """Adds a rule to `RULES` and returns `entry` unchanged: a `Rule`, or, as a decorator (like
    verl's `@register_policy_loss`), a function of no arguments named as the rule it returns,
    whose docstring names the rule's paper. ValueError for a name already registered, or a
    function named otherwise than its rule; TypeError when it returns no `Rule`."""
    rule = entry if isinstance(entry, Rule) else entry()
    if not isinstance(rule, Rule):
        raise TypeError(f"register_rule: {entry!r} must be a Rule or return one, got {type(rule).__name__}")
    if not isinstance(entry, Rule) and getattr(entry, "__name__", None) != rule.name:
        raise ValueError(f"register_rule: the entry of rule {rule.name!r} must be named {rule.name!r}")
    if rule.name in RULES:
        raise ValueError(f"register_rule: a rule named {rule.name!r} is already registered; give it a name of its own")
    RULES[rule.name] = rule
    return entry


def _ppo_like(name: str, anchor: Anchor, high: float, description: str, **kw: Any) -> Rule:
    return Rule(name, 0.2, high, anchor, "ratio", description, **kw)


def _dppo(name: str, measure: Measure, anchor: Anchor, bound: float, description: str) -> Rule:
    return Rule(name, bound, bound, anchor, measure, description)


def _rejection(name: str, statistic: Statistic | None, low: float, high: float, what: str) -> Rule:
    return Rule(
        name,
        low,
        high,
        "mu",
        "ratio",
        f"verl rollout correction: reject {what} whose π_old/μ leaves [1 − low, 1 + high]",
        statistic=statistic,
        sides="both",
        policy="old",
    )


# The token trust regions (docs/rules.md "Rules"); DPPO is Qi et al. 2026, "Rethinking the Trust
# Region in LLM Reinforcement Learning" (arXiv 2602.04879), which compares them all.


@register_rule
def ppo() -> Rule:
    """PPO's ratio clip (Schulman et al. 2017, "Proximal Policy Optimization Algorithms"), as GRPO
    uses it (Shao et al. 2024, "DeepSeekMath"), anchored on the rollout policy μ."""
    return _ppo_like("ppo", "mu", 0.2, "PPO/GRPO ratio clip: block when π/μ leaves [1 − low, 1 + high]")


@register_rule
def ppo_clip_higher() -> Rule:
    """DAPO's clip-higher (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale")."""
    return _ppo_like("ppo_clip_higher", "mu", 0.28, "DAPO clip-higher: PPO's ratio clip with a wider upper bound")


@register_rule
def minirl() -> Rule:
    """MiniRL: PPO's clip anchored on the recomputed π_old, as the DPPO paper compares it."""
    return _ppo_like("minirl", "old", 0.2, "MiniRL: PPO's ratio clip, anchored on the recomputed π_old")


@register_rule
def dppo_binary_tv() -> Rule:
    """DPPO with the binary total variation (Qi et al. 2026): d = |π − μ| of the sampled token, the
    TV between the two-bucket distributions {a_t, the rest}."""
    return _dppo("dppo_binary_tv", "binary_tv", "mu", 0.15, "DPPO: block when |π − μ| of a_t > bound")


@register_rule
def dppo_binary_kl() -> Rule:
    """DPPO with the binary KL (Qi et al. 2026): d = KL(μ‖π) over the buckets {a_t, the rest}, nats."""
    return _dppo("dppo_binary_kl", "binary_kl", "mu", 0.05, "DPPO: block when the binary KL(μ‖π) > bound")


@register_rule
def dppo_topk_tv() -> Rule:
    """DPPO with the top-K total variation (Qi et al. 2026): d = the TV over μ's top-K ids and the
    rest bucket, which the caller computes (`topk_tv`, trustlens.divergence.topk_divergence); at
    least the binary TV."""
    return _dppo("dppo_topk_tv", "topk_tv", "mu", 0.15, "DPPO: block when the top-K TV(μ, π) > bound")


@register_rule
def dppo_topk_kl() -> Rule:
    """DPPO with the top-K KL (Qi et al. 2026): d = KL(μ‖π) over μ's top-K ids and the rest bucket
    (`topk_kl`), nats; at least the binary KL."""
    return _dppo("dppo_topk_kl", "topk_kl", "mu", 0.05, "DPPO: block when the top-K KL(μ‖π) > bound")


@register_rule
def dppo_binary_tv_recompute() -> Rule:
    """DPPO binary TV anchored on π_old, the DPPO paper's ablation of the anchor (Qi et al. 2026)."""
    return _dppo(
        "dppo_binary_tv_recompute",
        "binary_tv",
        "old",
        0.15,
        "DPPO binary TV, anchored on the recomputed π_old instead of μ",
    )


@register_rule
def dppo_binary_kl_recompute() -> Rule:
    """DPPO binary KL anchored on π_old, the DPPO paper's ablation of the anchor (Qi et al. 2026)."""
    return _dppo(
        "dppo_binary_kl_recompute",
        "binary_kl",
        "old",
        0.05,
        "DPPO binary KL, anchored on the recomputed π_old instead of μ",
    )


@register_rule
def cispo() -> Rule:
    """CISPO (MiniMax 2025, "MiniMax-M1"): a capped IS weight, no trust region."""
    return Rule(
        "cispo",
        None,
        0.28,
        "mu",
        None,
        "CISPO: never blocks; the IS weight π/μ is capped at 1 + high instead",
        weight="cispo",
    )


@register_rule
def pg_is() -> Rule:
    """The policy gradient with a truncated IS weight and no trust region, the DPPO paper's
    baseline without one (Qi et al. 2026)."""
    return Rule("pg_is", None, None, "mu", None, "policy gradient with IS weight min(π/μ, C); no trust region")


@register_rule
def grpo_tis() -> Rule:
    """GRPO's clip against π_old with truncated importance sampling of π_old/μ (Yao et al. 2025,
    "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training")."""
    return _ppo_like(
        "grpo_tis",
        "old",
        0.2,
        "GRPO ratio clip vs π_old, times the truncated IS weight min(π_old/μ, C_tis)",
        weight="tis",
        tis_cap=2.0,
    )


_TRUST_REGIONS = len(RULES)

# The corrections beyond the token trust regions (docs/rules.md gives each one's formula,
# default, source and verl/TRL name).


@register_rule
def icepop() -> Rule:
    """IcePop (Ling team 2025, Ring-1T): no gradient for tokens whose π_old/μ leaves [0.5, 5], either side."""
    return Rule(
        "icepop",
        0.5,
        4.0,
        "mu",
        "ratio",
        "IcePop: no gradient for tokens whose π_old/μ leaves [1 − low, 1 + high] = [0.5, 5]",
        sides="both",
        policy="old",
    )


@register_rule
def dual_clip() -> Rule:
    """Dual-clip PPO (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep
    Reinforcement Learning"): PPO's clip, and no gradient for A < 0 tokens whose π/μ > c = 3."""
    return Rule(
        "dual_clip",
        0.2,
        0.2,
        "mu",
        "ratio",
        "dual-clip PPO: PPO's ratio clip, and no gradient for A < 0 tokens whose π/μ > c = 3",
        dual_clip=3.0,
    )


@register_rule
def gspo() -> Rule:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", Qwen3): the response's
    geometric-mean ratio s = (Π_t π/π_old)^(1/|y|) clipped to [1 − 3e-4, 1 + 4e-4], weight s."""
    return Rule(
        "gspo",
        3e-4,
        4e-4,
        "old",
        "ratio",
        "GSPO: block a response whose geometric-mean ratio (Π π/π_old)^(1/|y|) leaves [1 − low, 1 + high]",
        weight="seq_ratio",
        statistic="mean",
    )


@register_rule
def gmpo() -> Rule:
    """GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization"): token log-ratios
    log(π/π_old) clipped to [−0.4, 0.4], weight the geometric mean of the clipped ratios."""
    return Rule(
        "gmpo",
        0.4,
        0.4,
        "old",
        "log_ratio",
        "GMPO: clip log(π/π_old) to [−low, high]; weight the geometric mean of the clipped ratios",
        weight="geo_mean",
    )


@register_rule
def rs_token() -> Rule:
    """verl's rollout correction (Liu, Li et al. 2025): reject tokens whose π_old/μ leaves [0.5, 2]."""
    return _rejection("rs_token", None, 0.5, 1.0, "tokens")


@register_rule
def rs_seq() -> Rule:
    """verl's rollout correction (Liu, Li et al. 2025): reject responses whose Π_t π_old/μ leaves [0.5, 2]."""
    return _rejection("rs_seq", "sum", 0.5, 1.0, "responses (product of the token ratios)")


@register_rule
def rs_geo() -> Rule:
    """verl's rollout correction (Liu, Li et al. 2025): reject responses whose geometric-mean
    π_old/μ leaves [0.999, 1.001]."""
    return _rejection("rs_geo", "mean", 1e-3, 1e-3, "responses (geometric mean of the token ratios)")


@register_rule
def grpo_seq_tis() -> Rule:
    """verl's rollout correction (Liu, Li et al. 2025): the PPO clip against π_old weighted by the
    sequence-level truncated IS weight min(Π_t π_old/μ, 2)."""
    return Rule(
        "grpo_seq_tis",
        0.2,
        0.2,
        "old",
        "ratio",
        "GRPO ratio clip vs π_old, times the sequence-level truncated IS weight min(Π π_old/μ, C_tis)",
        weight="seq_tis",
        tis_cap=2.0,
    )


@register_rule
def clip_cov() -> Rule:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
    Language Models"; trustlens.rules.batch): PPO's clip against π_old, and no gradient for a
    seeded random share 2e-4 of the tokens with 1 < cov < 5."""
    return Rule(
        "clip_cov",
        0.2,
        0.2,
        "old",
        "ratio",
        "Clip-Cov: PPO's clip vs π_old, and no gradient for a random share cov_ratio of the batch's "
        "tokens with cov(log π, A) in (cov_low, cov_high)",
        cov="clip",
        cov_ratio=2e-4,
        cov_low=1.0,
        cov_high=5.0,
    )


@register_rule
def kl_cov() -> Rule:
    """KL-Cov (Cui et al. 2025, as Clip-Cov): the penalty |log π − log π_old| (coefficient 1) on
    the top share 2e-4 of the tokens by cov."""
    return Rule(
        "kl_cov",
        None,
        None,
        "old",
        None,
        "KL-Cov: the penalty kl_coef·|log π − log π_old| on the top share cov_ratio of the batch's "
        "tokens by cov(log π, A)",
        cov="kl",
        cov_ratio=2e-4,
        kl_coef=1.0,
    )


# The built-in corrections, in the order registered.
CORRECTIONS: tuple[Rule, ...] = tuple(RULES.values())[_TRUST_REGIONS:]


def get_rule(rule: str | Rule) -> Rule:
    """A rule by name (or the rule itself); KeyError listing the known rules for an unknown name."""
    if isinstance(rule, Rule):
        return rule
    try:
        return RULES[rule]
    except (KeyError, TypeError):
        hint = closest(rule, RULES) if isinstance(rule, str) else ""
        raise KeyError(f"unknown rule {rule!r}{hint}; known rules: {', '.join(RULES)}") from None


__all__ = [
    "CORRECTIONS",
    "RULES",
    "Anchor",
    "Measure",
    "Policy",
    "Rule",
    "Sides",
    "Statistic",
    "WeightKind",
    "get_rule",
    "register_rule",
]
