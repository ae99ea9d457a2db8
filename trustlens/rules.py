"""The trust-region rules of docs/rules.md: which token updates each RL objective blocks.

A rule looks at one sampled token a_t, its advantage A and how far the policy being updated, π,
has moved from the rule's anchor (the rollout policy μ, or the recomputed π_old), and decides
whether the update of that token is **blocked** (gets no gradient). Every blocking rule has the
same shape, with a distance d(π, anchor) and two thresholds:

    blocked = (A > 0  and  π(a_t) > anchor(a_t)  and  d > high)
           or (A < 0  and  π(a_t) < anchor(a_t)  and  d > low)

so a token is only blocked when the update the advantage asks for (raise π(a_t) when A > 0,
lower it when A < 0) would push π further out of the trust region; a token that has left the
region on the other side is still updated, since the update brings it back. A token with A = 0
carries no gradient and is never blocked. The distances (`Rule.measure`):

    ratio       |π/anchor − 1|        (so PPO's "ratio > 1 + high" / "ratio < 1 − low")
    binary_tv   |π − anchor|          (so DPPO-TV's "π − μ > high" / "π − μ < −low")
    binary_kl   KL(anchor_bin ‖ π_bin) over the buckets {a_t, rest}, nats
    topk_tv     TV over μ's top-K ids plus the rest bucket (precomputed, anchor μ)
    topk_kl     KL(μ ‖ π) over μ's top-K ids plus the rest bucket (precomputed, anchor μ), nats

A KL of +inf (π gives probability 0 to a token μ gave mass to) is beyond every threshold; the
direction condition still applies. Log-probabilities of −inf are valid input.

Rules are named by the registry `RULES`. Each rule is defined once and decided by one function,
`decide`, on torch tensors (`evaluate`, `evaluate_all`: what the recorder and the trainer call)
and on the columns of a recorded run (`trustlens.rule_columns.evaluate_columns`: numpy, no
torch needed, what the analyses and the dashboard call). This module imports no torch at import time. Rules can be
evaluated counterfactually: the inputs only describe the tokens, not the rule they were trained
under.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from trustlens import _logspace

if TYPE_CHECKING:
    import torch

Anchor = Literal["mu", "old"]
Measure = Literal["ratio", "binary_tv", "binary_kl", "topk_tv", "topk_kl"]
WeightKind = Literal["ratio", "cispo", "tis"]

# what each optional input of `evaluate` holds, for error messages
_INPUT_DOCS = {
    "old_logp": "log π_old(a_t), the trainer's recomputation before the update",
    "topk_tv": "the top-K TV per token, from trustlens.divergence.topk_divergence",
    "topk_kl": "the top-K KL per token, from trustlens.divergence.topk_divergence",
}


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
    weight: WeightKind = "ratio"  # the loss weight w, see trustlens.loss.policy_loss
    tis_cap: float | None = None  # grpo_tis only: C_tis, the truncation of the weight π_old/μ

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a rule's name must be a non-empty string, got {self.name!r}")
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
        raise KeyError(f"unknown rule {rule!r}; known rules: {', '.join(RULES)}") from None


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


def decide(rule: Rule, d: Any, pi_logp: Any, anchor_logp: Any, advantages: Any) -> Any:
    """The one definition of blocking (module docstring), on torch tensors or numpy arrays alike.

    d: the rule's distance per token; pi_logp, anchor_logp: log π(a_t), log anchor(a_t);
    advantages: A per token. A NaN distance (π and anchor both 0) blocks nothing, +inf is beyond
    every threshold. Returns a bool array of their shape, True = blocked; all False for a rule
    that never blocks.
    """
    if not rule.blocks:
        return (pi_logp > 0) & (pi_logp < 0)  # all False, as a bool array of pi_logp's kind and device
    push_up = (advantages > 0) & (pi_logp > anchor_logp) & (d > rule.high)
    push_down = (advantages < 0) & (pi_logp < anchor_logp) & (d > rule.low)
    return push_up | push_down


def _distance(measure: str, pi_logp: Any, anchor_logp: Any, eps: float, xp: Any) -> Any:
    """d(π, anchor) of a computed measure (ratio, binary TV/KL) per token, in namespace xp."""
    if measure == "ratio":
        return _logspace.ratio_distance(pi_logp, anchor_logp, xp)
    if measure == "binary_tv":
        return _logspace.abs_diff_exp(pi_logp, anchor_logp, xp)
    return _logspace.binary_kl(pi_logp, anchor_logp, eps, xp)


class TokenInputs:
    """The per-token inputs of the rules on torch tensors, checked once: upcast to float32+,
    detached, advantages broadcast to the token shape. Caches the quantities several rules share
    (the distance of π from each anchor), so that evaluating many rules costs each once."""

    def __init__(
        self,
        *,
        pi_logp: torch.Tensor,  # (B, T) or any shape: log π(a_t)
        mu_logp: torch.Tensor,  # same shape: log μ(a_t)
        advantages: torch.Tensor,  # (B,) per sequence or the token shape
        old_logp: torch.Tensor | None = None,  # token shape: log π_old(a_t)
        topk_tv: torch.Tensor | None = None,  # token shape
        topk_kl: torch.Tensor | None = None,  # token shape; +inf allowed
    ) -> None:
        import torch

        from trustlens._checks import broadcast_advantages, check_logp, check_nonnegative, check_same_shape

        self.pi_logp = check_logp("pi_logp", pi_logp).detach()
        # binary_kl reads log π = 0 as 1 − π = eps/2 of the (upcast) dtype: see _logspace.binary_kl
        self.eps = _eps(self.pi_logp.dtype == torch.float64)
        self.mu_logp = check_logp("mu_logp", mu_logp).detach()
        self.old_logp = None if old_logp is None else check_logp("old_logp", old_logp).detach()
        self.given = {
            "old_logp": self.old_logp,
            "topk_tv": None if topk_tv is None else check_nonnegative("topk_tv", topk_tv).detach(),
            "topk_kl": None if topk_kl is None else check_nonnegative("topk_kl", topk_kl, allow_inf=True).detach(),
        }
        check_same_shape(pi_logp=self.pi_logp, mu_logp=self.mu_logp, **self.given)
        self.advantages = broadcast_advantages(advantages, self.pi_logp).detach()
        self._cache: dict[tuple[str, str], torch.Tensor] = {}

    def require(self, rule: Rule) -> None:
        """ValueError naming the rule and the argument when an input `rule` needs is missing."""
        require_inputs(rule, {k: v is not None for k, v in self.given.items()})

    def anchor_logp(self, anchor: Anchor) -> torch.Tensor:
        out = self.mu_logp if anchor == "mu" else self.old_logp
        assert out is not None  # `require` checked it
        return out

    def distance(self, rule: Rule) -> torch.Tensor:
        """d(π, anchor) of `rule` per token."""
        if rule.measure in ("topk_tv", "topk_kl"):
            given = self.given[rule.measure]
            assert given is not None  # `require` checked it
            return given
        key = (str(rule.measure), rule.anchor)
        if key not in self._cache:
            import torch

            self._cache[key] = _distance(key[0], self.pi_logp, self.anchor_logp(rule.anchor), self.eps, torch)
        return self._cache[key]

    def blocked(self, rule: Rule) -> torch.Tensor:
        """The bool mask of tokens `rule` blocks (True = no gradient), token shape."""
        self.require(rule)
        if not rule.blocks:
            return decide(rule, None, self.pi_logp, None, None)
        return decide(rule, self.distance(rule), self.pi_logp, self.anchor_logp(rule.anchor), self.advantages)


def require_inputs(rule: Rule, given: Mapping[str, bool]) -> None:
    """ValueError naming the rule and the argument when an input `rule` needs is not `given`
    ({"old_logp" | "topk_tv" | "topk_kl": whether it is given})."""
    for arg in rule.needs:
        if not given[arg]:
            raise ValueError(f"rule {rule.name!r} needs {arg} ({_INPUT_DOCS[arg]}), which was not given")


def _eps(float64: bool) -> float:
    """Machine epsilon of float64 or float32, the widths the rules compute in."""
    return float(np.finfo(np.float64 if float64 else np.float32).eps)


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
    the rule's default). `advantages` is per sequence (B,) or per token like pi_logp; tokens with
    A = 0 are never blocked. Log-probabilities may be −inf and topk_kl +inf. Raises KeyError for
    an unknown rule, ValueError for an input the rule needs that is missing, for mismatched
    shapes, NaN, positive log-probabilities or negative divergences.
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

    `rules` is a list of names / `Rule`s or a mapping (see `resolve_rules`). The inputs are
    checked once and each shared quantity is computed once. Every rule's needed inputs are
    checked before any is evaluated. Needs torch (`pip install "trustlens[torch]"`); on the
    columns of a recorded run use `evaluate_columns`.
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
