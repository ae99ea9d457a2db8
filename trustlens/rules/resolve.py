"""`resolve_rules`: the rules a caller names (names, `Rule`s, thresholds or a run's manifest
entries), resolved against the registry `RULES` (trustlens.rules.registry), `rule_from_manifest`
(one manifest entry), and `check_not_builtin`, which keeps a custom rule from taking a built-in rule's name. Imports no
torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from trustlens.rules.registry import RULES, get_rule
from trustlens.rules.rule import COV_FIELDS, Rule

RuleSpec = Iterable[str | Rule] | Mapping[str, tuple[float | None, float | None]] | Mapping[str, Mapping[str, Any]]


def resolve_rules(rules: RuleSpec) -> list[Rule]:
    """Rules as given to `evaluate_all` / `evaluate_columns`, with their thresholds resolved.

    `rules` is either
      - a list of names (default thresholds) or `Rule` objects (e.g.
        `RULES["ppo"].with_thresholds(high=0.28)`),
      - a mapping name -> (low, high), None keeping that default: {"ppo": (0.1, 0.3)}, or
      - a run's manifest rules, name -> {low, high, anchor, measure, ...} (`Run.rules`), which
        also brings back custom rules (`rule_from_manifest`).
    Names must be unique: they key the result of `evaluate_all`.
    """
    if isinstance(rules, str):
        raise ValueError(f"rules must be a list of rule names, got the string {rules!r}; use [{rules!r}]")
    if not isinstance(rules, (Mapping, Iterable)):
        raise TypeError(f"rules must be a list of rule names or a mapping {{rule: thresholds}}, got {rules!r:.80}")
    if isinstance(rules, Mapping):
        resolved = [
            rule_from_manifest(name, t) if isinstance(t, Mapping) else get_rule(name).with_thresholds(*_pair(name, t))
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


def rule_from_manifest(name: str, entry: Mapping[str, Any]) -> Rule:
    """The rule `name` as a run's manifest records it (`Rule.from_manifest`), with the registry's
    rule of that name for an entry written before the manifest kept the measure. ValueError for
    an entry that is not a mapping, or that names no measure and no built-in rule."""
    return Rule.from_manifest(name, entry, RULES.get(name))


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


__all__ = ["RuleSpec", "check_not_builtin", "resolve_rules", "rule_from_manifest"]
