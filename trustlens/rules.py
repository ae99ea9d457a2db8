"""The trust-region rules of DESIGN §2: which token updates each RL objective blocks.

A rule looks at one sampled token a_t, its advantage A and how far the policy being updated, π,
has moved from the rule's anchor (the rollout policy μ, or the recomputed π_old), and decides
whether the update of that token is **blocked** (gets no gradient). Every blocking rule has the
same shape, with a distance d(π, anchor) and two thresholds:

    blocked = (A > 0  and  π(a_t) > anchor(a_t)  and  d > high)
           or (A ≤ 0  and  π(a_t) < anchor(a_t)  and  d > low)

so a token is only blocked when the update the advantage asks for (raise π(a_t) when A > 0,
lower it when A ≤ 0) would push π further out of the trust region; a token that has left the
region on the other side is still updated, since the update brings it back. A = 0 falls in the
A ≤ 0 branch. The distances (`Rule.measure`):

    ratio       |π/anchor − 1|        (so PPO's "ratio > 1 + high" / "ratio < 1 − low")
    binary_tv   |π − anchor|          (so DPPO-TV's "π − μ > high" / "π − μ < −low")
    binary_kl   KL(anchor_bin ‖ π_bin) over the buckets {a_t, rest}, nats
    topk_tv     TV over μ's top-K ids plus the rest bucket (precomputed, anchor μ)
    topk_kl     KL(μ ‖ π) over μ's top-K ids plus the rest bucket (precomputed, anchor μ), nats

Rules are named by the registry `RULES`. `evaluate` decides one rule; `evaluate_all` decides many
in one pass, computing each shared quantity (ratio, binary TV/KL per anchor) once. Rules can be
evaluated counterfactually: the inputs only describe the tokens, not the rule they were trained
under.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

import torch

from trustlens._checks import (
    broadcast_advantages,
    check_logp,
    check_nonnegative,
    check_same_shape,
)
from trustlens.divergence import binary_kl, binary_tv

Anchor = Literal["mu", "old"]
Measure = Literal["ratio", "binary_tv", "binary_kl", "topk_tv", "topk_kl"]
WeightKind = Literal["ratio", "cispo", "tis"]

# what each optional input of `evaluate` holds, for error messages
_INPUT_DOCS = {
    "old_logp": "log π_old(a_t), the trainer's recomputation before the update",
    "topk_tv": "the top-K TV per token, from trustlens.divergence.topk_divergence",
    "topk_kl": "the top-K KL per token, from trustlens.divergence.topk_divergence",
}


@dataclass(frozen=True)
class Rule:
    """One trust-region rule: its thresholds, its anchor, and the loss weight it trains with."""

    name: str  # registry key; also the suffix of the `blocked_<name>` column of a recorded run
    low: float | None  # threshold on the distance when A ≤ 0; None: no such threshold
    high: float | None  # threshold when A > 0; for cispo the IS-weight cap is 1 + high
    anchor: Anchor  # centre of the trust region: "mu" (rollout policy) or "old" (π_old)
    measure: Measure | None  # the distance compared with low/high; None: the rule never blocks
    description: str  # one line, for docs, the dashboard and the CLI
    weight: WeightKind = "ratio"  # the loss weight w, see trustlens.loss.policy_loss
    tis_cap: float | None = None  # grpo_tis only: C_tis, the truncation of the weight π_old/μ

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
            if value is None:
                continue
            if getattr(self, side) is None:
                raise ValueError(f"rule {self.name!r} has no {side} threshold; got {side}={value!r}")
            real = isinstance(value, numbers.Real) and not isinstance(value, bool)
            if not real or not math.isfinite(value) or value < 0:
                raise ValueError(f"rule {self.name!r}: {side} must be a finite number ≥ 0, got {value!r}")
        return replace(
            self,
            low=self.low if low is None else float(low),
            high=self.high if high is None else float(high),
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

# how each computed measure is obtained from (π, anchor) log-probabilities
_MEASURES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "ratio": lambda pi, anchor: torch.expm1(pi - anchor).abs(),
    "binary_tv": binary_tv,
    "binary_kl": binary_kl,
}


def get_rule(rule: str | Rule) -> Rule:
    """A rule by name (or the rule itself); KeyError listing the known rules for an unknown name."""
    if isinstance(rule, Rule):
        return rule
    try:
        return RULES[rule]
    except (KeyError, TypeError):
        raise KeyError(f"unknown rule {rule!r}; known rules: {', '.join(RULES)}") from None


RuleSpec = Iterable[str | Rule] | Mapping[str, tuple[float | None, float | None]]


def resolve_rules(rules: RuleSpec) -> list[Rule]:
    """Rules as given to `evaluate_all`, with their thresholds resolved.

    `rules` is either
      - a list of names (default thresholds) or `Rule` objects (e.g.
        `RULES["ppo"].with_thresholds(high=0.28)`), or
      - a mapping name -> (low, high), None keeping that default: {"ppo": (0.1, 0.3)}.
    Names must be unique: they key the result of `evaluate_all`.
    """
    if isinstance(rules, str):
        raise ValueError(f"rules must be a list of rule names, got the string {rules!r}; use [{rules!r}]")
    if isinstance(rules, Mapping):
        resolved = [get_rule(name).with_thresholds(*_pair(name, t)) for name, t in rules.items()]
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


class TokenInputs:
    """The per-token inputs of the rules, checked once: upcast to float32+, detached, advantages
    broadcast to the token shape. Caches the quantities several rules share (the distance of π
    from each anchor, the direction π moved), so that evaluating many rules costs each once."""

    def __init__(
        self,
        *,
        pi_logp: torch.Tensor,  # (B, T) or any shape: log π(a_t)
        mu_logp: torch.Tensor,  # same shape: log μ(a_t)
        advantages: torch.Tensor,  # (B,) per sequence or the token shape
        old_logp: torch.Tensor | None = None,  # token shape: log π_old(a_t)
        topk_tv: torch.Tensor | None = None,  # token shape
        topk_kl: torch.Tensor | None = None,  # token shape
    ) -> None:
        self.pi_logp = check_logp("pi_logp", pi_logp).detach()
        self.mu_logp = check_logp("mu_logp", mu_logp).detach()
        self.old_logp = None if old_logp is None else check_logp("old_logp", old_logp).detach()
        self.given = {
            "old_logp": self.old_logp,
            "topk_tv": None if topk_tv is None else check_nonnegative("topk_tv", topk_tv).detach(),
            "topk_kl": None if topk_kl is None else check_nonnegative("topk_kl", topk_kl).detach(),
        }
        check_same_shape(pi_logp=self.pi_logp, mu_logp=self.mu_logp, **self.given)
        self.advantages = broadcast_advantages(advantages, self.pi_logp).detach()
        self._cache: dict[tuple[str, str], torch.Tensor] = {}

    def require(self, rule: Rule) -> None:
        """ValueError naming the rule and the argument when an input `rule` needs is missing."""
        for arg in rule.needs:
            if self.given[arg] is None:
                raise ValueError(f"rule {rule.name!r} needs {arg} ({_INPUT_DOCS[arg]}), which was not given")

    def anchor_logp(self, anchor: Anchor) -> torch.Tensor:
        return self.mu_logp if anchor == "mu" else self.old_logp

    def _shared(self, key: tuple[str, str], compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def distance(self, rule: Rule) -> torch.Tensor:
        """d(π, anchor) of `rule` per token."""
        if rule.measure in ("topk_tv", "topk_kl"):
            return self.given[rule.measure]
        anchor = self.anchor_logp(rule.anchor)
        compute = _MEASURES[rule.measure]
        return self._shared((rule.measure, rule.anchor), lambda: compute(self.pi_logp, anchor))

    def blocked(self, rule: Rule) -> torch.Tensor:
        """The bool mask of tokens `rule` blocks (True = no gradient), token shape."""
        self.require(rule)
        if not rule.blocks:
            return torch.zeros(self.pi_logp.shape, dtype=torch.bool, device=self.pi_logp.device)
        anchor = self.anchor_logp(rule.anchor)
        up = self._shared(("up", rule.anchor), lambda: self.pi_logp > anchor)
        down = self._shared(("down", rule.anchor), lambda: self.pi_logp < anchor)
        positive = self._shared(("positive", ""), lambda: self.advantages > 0)
        d = self.distance(rule)
        return torch.where(positive, up & (d > rule.high), down & (d > rule.low))


def evaluate(
    rule: str | Rule,
    *,
    pi_logp: torch.Tensor,
    mu_logp: torch.Tensor,
    advantages: torch.Tensor,
    old_logp: torch.Tensor | None = None,
    topk_tv: torch.Tensor | None = None,
    topk_kl: torch.Tensor | None = None,
    low: float | None = None,
    high: float | None = None,
) -> torch.Tensor:
    """Which tokens `rule` blocks: a bool tensor of pi_logp's shape, True = blocked.

    `rule` is a name from `RULES` or a `Rule`; `low` / `high` override its thresholds (None keeps
    the rule's default). `advantages` is per sequence (B,) or per token like pi_logp. Raises
    KeyError for an unknown rule, ValueError for an input the rule needs that is missing, for
    mismatched shapes, non-finite values or positive log-probabilities.
    """
    rule = get_rule(rule).with_thresholds(low, high)
    blocked = evaluate_all(
        [rule],
        pi_logp=pi_logp,
        mu_logp=mu_logp,
        advantages=advantages,
        old_logp=old_logp,
        topk_tv=topk_tv,
        topk_kl=topk_kl,
    )
    return blocked[rule.name]


def evaluate_all(
    rules: RuleSpec,
    *,
    pi_logp: torch.Tensor,
    mu_logp: torch.Tensor,
    advantages: torch.Tensor,
    old_logp: torch.Tensor | None = None,
    topk_tv: torch.Tensor | None = None,
    topk_kl: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """`evaluate` for many rules in one pass: {rule name: blocked mask}, in the order given.

    `rules` is a list of names / `Rule`s or a mapping name -> (low, high) (see `resolve_rules`).
    The inputs are checked once and each shared quantity is computed once. Every rule's needed
    inputs are checked before any is evaluated.
    """
    resolved = resolve_rules(rules)
    inputs = TokenInputs(
        pi_logp=pi_logp,
        mu_logp=mu_logp,
        advantages=advantages,
        old_logp=old_logp,
        topk_tv=topk_tv,
        topk_kl=topk_kl,
    )
    for rule in resolved:
        inputs.require(rule)
    return {rule.name: inputs.blocked(rule) for rule in resolved}
