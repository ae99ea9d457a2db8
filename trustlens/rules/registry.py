"""The trust-region rules themselves, re-exported by trustlens.rules (whose docstring gives the
math): `Rule`, one rule's thresholds, anchor, distance measure and loss weight, validated when
built; the registry `RULES` of the rules of docs/rules.md with their default thresholds (ratios
for the "ratio" measure, probabilities for binary/top-K TV, nats for the KLs); and the look-ups
`get_rule` (a rule by name) and `resolve_rules` (the rules a caller names, with their thresholds).
Imports no torch.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from trustlens.core.values import closest

Anchor = Literal["mu", "old"]
Measure = Literal["ratio", "binary_tv", "binary_kl", "topk_tv", "topk_kl"]
WeightKind = Literal["ratio", "cispo", "tis"]
# The measures that are total variations, in [0, 1]: their thresholds are at most 1.
TV_MEASURES = ("binary_tv", "topk_tv")


def _check_threshold(rule: str, what: str, value: object, *, above: float = 0.0, strict: bool = False) -> float:
    """`value` as a float, or ValueError naming the rule and the threshold: it must be a finite
    real number ≥ `above` (> with strict=True)."""
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not real or not math.isfinite(value) or value < above or (strict and value == above):  # type: ignore[operator, arg-type]
        bound = f"{'>' if strict else '≥'} {above:g}"
        raise ValueError(f"rule {rule!r}: {what} must be a finite number {bound}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Rule:
    """One trust-region rule: its thresholds, its anchor, and the loss weight it trains with.

    Validated when built: thresholds finite and ≥ 0 (a blocking rule needs both), a known anchor,
    measure and weight, a finite tis_cap > 0 for the "tis" weight. Errors name the rule.
    """

    name: str  # registry key; also the suffix of the `blocked_<name>` column of a recorded run
    low: float | None  # threshold on the distance when A < 0; None: no such threshold
    high: float | None  # threshold when A > 0; for cispo the IS-weight cap is 1 + high
    anchor: Anchor  # centre of the trust region: "mu" (rollout policy) or "old" (π_old)
    measure: Measure | None  # the distance compared with low/high; None: the rule never blocks
    description: str  # one line, for docs, the dashboard and the CLI
    weight: WeightKind = "ratio"  # the loss weight w, see trustlens.rules.loss.policy_loss
    tis_cap: float | None = None  # grpo_tis only: C_tis, the truncation of the weight π_old/μ

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a rule's name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.description, str):
            raise TypeError(f"rule {self.name!r}: description must be a string, got {type(self.description).__name__}")
        for field, value, allowed in (
            ("anchor", self.anchor, get_args(Anchor)),
            ("measure", self.measure, (*get_args(Measure), None)),
            ("weight", self.weight, get_args(WeightKind)),
        ):
            if value not in allowed:
                raise ValueError(f"rule {self.name!r}: {field} must be one of {allowed}, got {value!r}")
        if self.measure in ("topk_tv", "topk_kl") and self.anchor != "mu":
            raise ValueError(f"rule {self.name!r}: the top-K measures are anchored on μ, got anchor {self.anchor!r}")
        for side in ("low", "high"):
            value = getattr(self, side)
            if value is not None:
                object.__setattr__(self, side, _check_threshold(self.name, side, value))
                if self.measure in TV_MEASURES and value > 1:  # a total variation is at most 1
                    raise ValueError(
                        f"rule {self.name!r}: {side} must be ≤ 1 for the {self.measure} measure (a total "
                        f"variation is in [0, 1], a bound above 1 never blocks), got {value!r}"
                    )
            elif self.measure is not None or (side == "high" and self.weight == "cispo"):
                raise ValueError(f"rule {self.name!r}: {side} is required (the rule uses it), got None")
        if self.weight == "tis":
            cap = _check_threshold(self.name, "tis_cap", self.tis_cap, strict=True)
            object.__setattr__(self, "tis_cap", cap)
        elif self.tis_cap is not None:
            raise ValueError(f"rule {self.name!r}: tis_cap applies only to weight 'tis', got {self.tis_cap!r}")

    @property
    def blocks(self) -> bool:
        """Whether the rule can block a token at all (cispo and pg_is never do)."""
        return self.measure is not None

    @property
    def needs(self) -> tuple[str, ...]:
        """The optional inputs of `evaluate` / `policy_loss` this rule requires."""
        needs = ["old_logp"] if self.anchor == "old" or self.weight == "tis" else []
        if self.measure in ("topk_tv", "topk_kl"):
            needs.append(self.measure)
        return tuple(needs)

    def with_thresholds(self, low: float | None = None, high: float | None = None) -> Rule:
        """This rule with `low` / `high` replaced where given (None keeps the default).

        Raises ValueError for a threshold that is negative or not finite, or that the rule does
        not have (e.g. `low` for cispo, either for pg_is).
        """
        for side, value in (("low", low), ("high", high)):
            if value is not None and getattr(self, side) is None:
                raise ValueError(f"rule {self.name!r} has no {side} threshold; got {side}={value!r}")
        return replace(self, low=self.low if low is None else low, high=self.high if high is None else high)

    def manifest_entry(self) -> dict[str, Any]:
        """The rule as a run's manifest records it (JSON types); `Rule.from_manifest` reads it back."""
        return {
            "low": self.low,
            "high": self.high,
            "anchor": self.anchor,
            "measure": self.measure,
            "weight": self.weight,
            "tis_cap": self.tis_cap,
            "description": self.description,
        }

    @classmethod
    def from_manifest(cls, name: str, entry: Mapping[str, Any]) -> Rule:
        """The rule `name` as a manifest entry records it ({low, high, anchor, measure, ...}), so
        that a custom rule a run evaluated can be evaluated again without its code. An entry
        without "measure" (written before it was recorded) takes the registry rule of that name
        with the entry's thresholds; ValueError when there is none."""
        if not isinstance(entry, Mapping):
            raise ValueError(f"rules[{name!r}] must be a mapping like {{'low': …, 'high': …}}, got {entry!r}")
        if "measure" not in entry:
            if name not in RULES:
                raise ValueError(
                    f"rule {name!r} is not a built-in rule and its record names no measure; "
                    "it cannot be evaluated again"
                )
            return RULES[name].with_thresholds(entry.get("low"), entry.get("high"))
        base = RULES.get(name)
        return cls(
            name=name,
            low=entry.get("low"),
            high=entry.get("high"),
            anchor=entry.get("anchor", "mu"),
            measure=entry["measure"],
            description=entry.get("description") or (base.description if base else ""),
            weight=entry.get("weight") or "ratio",
            tis_cap=entry.get("tis_cap"),
        )


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

RULES: dict[str, Rule] = {rule.name: rule for rule in _ALL}


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
    names = [rule.name for rule in resolved]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"rules lists {', '.join(duplicates)} more than once")
    return resolved


def _pair(name: str, thresholds: object) -> tuple[float | None, float | None]:
    if not isinstance(thresholds, (tuple, list)) or len(thresholds) != 2:
        raise ValueError(f"rules[{name!r}] must be a (low, high) pair, got {thresholds!r}")
    return thresholds[0], thresholds[1]
