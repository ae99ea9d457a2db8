"""The registry of trust-region rules, re-exported by trustlens.rules (whose docstring gives the
math): the registry `RULES` of the rules of docs/rules.md with their default thresholds (ratios
for the "ratio" measure, probabilities for binary/top-K TV, nats for the KLs), the token rules
defined here and the corrections of trustlens.rules.corrections; and the look-ups `get_rule` (a
rule by name) and `resolve_rules` (the rules a caller names, with their thresholds). `Rule`
itself is defined in trustlens.rules.rule. Imports no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from trustlens.core.values import closest
from trustlens.rules.corrections import CORRECTIONS
from trustlens.rules.rule import COV_FIELDS, RULES, Anchor, Measure, Policy, Rule, Sides, Statistic, WeightKind


def _ppo_like(name: str, anchor: Anchor, high: float, description: str, **kw) -> Rule:
    return Rule(name, 0.2, high, anchor, "ratio", description, **kw)


def _dppo(name: str, measure: Measure, anchor: Anchor, bound: float, description: str) -> Rule:
    return Rule(name, bound, bound, anchor, measure, description)


_ALL = (
    _ppo_like("ppo", "mu", 0.2, "PPO/GRPO ratio clip: block when π/μ leaves [1 − low, 1 + high]"),
    _ppo_like("ppo_clip_higher", "mu", 0.28, "DAPO clip-higher: PPO's ratio clip with a wider upper bound"),
    _ppo_like("minirl", "old", 0.2, "MiniRL: PPO's ratio clip, anchored on the recomputed π_old"),
    _dppo("dppo_binary_tv", "binary_tv", "mu", 0.15, "DPPO: block when |π − μ| of a_t > bound"),
    _dppo("dppo_binary_kl", "binary_kl", "mu", 0.05, "DPPO: block when the binary KL(μ‖π) > bound"),
    _dppo("dppo_topk_tv", "topk_tv", "mu", 0.15, "DPPO: block when the top-K TV(μ, π) > bound"),
    _dppo("dppo_topk_kl", "topk_kl", "mu", 0.05, "DPPO: block when the top-K KL(μ‖π) > bound"),
    _dppo(
        "dppo_binary_tv_recompute",
        "binary_tv",
        "old",
        0.15,
        "DPPO binary TV, anchored on the recomputed π_old instead of μ",
    ),
    _dppo(
        "dppo_binary_kl_recompute",
        "binary_kl",
        "old",
        0.05,
        "DPPO binary KL, anchored on the recomputed π_old instead of μ",
    ),
    Rule(
        "cispo",
        None,
        0.28,
        "mu",
        None,
        "CISPO: never blocks; the IS weight π/μ is capped at 1 + high instead",
        weight="cispo",
    ),
    Rule(
        "pg_is",
        None,
        None,
        "mu",
        None,
        "policy gradient with IS weight min(π/μ, C); no trust region",
    ),
    _ppo_like(
        "grpo_tis",
        "old",
        0.2,
        "GRPO ratio clip vs π_old, times the truncated IS weight min(π_old/μ, C_tis)",
        weight="tis",
        tis_cap=2.0,
    ),
)

RULES.update((rule.name, rule) for rule in (*_ALL, *CORRECTIONS))


def get_rule(rule: str | Rule) -> Rule:
    """A rule by name (or the rule itself); KeyError listing the known rules for an unknown name."""
    if isinstance(rule, Rule):
        return rule
    try:
        return RULES[rule]
    except (KeyError, TypeError):
        hint = closest(rule, RULES) if isinstance(rule, str) else ""
        raise KeyError(f"unknown rule {rule!r}{hint}; known rules: {', '.join(RULES)}") from None


RuleSpec = Iterable[str | Rule] | Mapping[str, tuple[float | None, float | None]] | Mapping[str, Mapping[str, Any]]


def resolve_rules(rules: RuleSpec) -> list[Rule]:
    """Rules as given to `evaluate_all` / `evaluate_columns`, with their thresholds resolved.

    `rules` is either
      - a list of names (default thresholds) or `Rule` objects (e.g.
        `RULES["ppo"].with_thresholds(high=0.28)`),
      - a mapping name -> (low, high), None keeping that default: {"ppo": (0.1, 0.3)}, or
      - a run's manifest rules, name -> {low, high, anchor, measure, ...} (`Run.rules`), which
        also brings back custom rules (`Rule.from_manifest`).
    Names must be unique: they key the result of `evaluate_all`.
    """
    if isinstance(rules, str):
        raise ValueError(f"rules must be a list of rule names, got the string {rules!r}; use [{rules!r}]")
    if not isinstance(rules, (Mapping, Iterable)):
        raise TypeError(f"rules must be a list of rule names or a mapping {{rule: thresholds}}, got {rules!r:.80}")
    if isinstance(rules, Mapping):
        resolved = [
            Rule.from_manifest(name, t) if isinstance(t, Mapping) else get_rule(name).with_thresholds(*_pair(name, t))
            for name, t in rules.items()
        ]
    else:
        resolved = [get_rule(rule) for rule in rules]
    for rule in resolved:
        check_not_builtin(rule)
    names = [rule.name for rule in resolved]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"rules lists {', '.join(duplicates)} more than once")
    return resolved


def check_not_builtin(rule: Rule) -> None:
    """ValueError when `rule` takes a built-in rule's name but decides or weighs otherwise than
    that rule (other thresholds, a batch rule's cov_ratio, cov_low, cov_high and kl_coef included,
    and another description are allowed): its `blocked_<name>` column would be read as the
    built-in rule's by every analysis."""
    builtin = RULES.get(rule.name)
    if builtin is None or rule is builtin:
        return
    same: dict[str, Any] = {"low": builtin.low, "high": builtin.high, "description": builtin.description}
    if builtin.cov is not None and rule.cov == builtin.cov:
        same |= {k: getattr(builtin, k) for k in COV_FIELDS}
    if replace(rule, **same) != builtin:
        raise ValueError(
            f"rule {rule.name!r} is the name of a built-in rule, but this rule is defined otherwise "
            f"({rule.manifest_entry()}); give a custom rule a name of its own"
        )


def _pair(name: str, thresholds: object) -> tuple[float | None, float | None]:
    if not isinstance(thresholds, (tuple, list)) or len(thresholds) != 2:
        raise ValueError(f"rules[{name!r}] must be a (low, high) pair, got {thresholds!r}")
    return thresholds[0], thresholds[1]


__all__ = [
    "RULES",
    "Anchor",
    "Measure",
    "Policy",
    "Rule",
    "RuleSpec",
    "Sides",
    "Statistic",
    "WeightKind",
    "check_not_builtin",
    "get_rule",
    "resolve_rules",
]
