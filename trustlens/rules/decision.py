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
and on the columns of a recorded run (`trustlens.rules.columns.evaluate_columns`: numpy, no
torch needed, what the analyses and the dashboard call). This module imports no torch at import time. Rules can be
evaluated counterfactually: the inputs only describe the tokens, not the rule they were trained
under.

Every name is importable from trustlens.rules; `Rule`, `RULES`, `get_rule` and `resolve_rules` are
defined in trustlens.rules.registry, the decision and its evaluation on tensors here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from trustlens.core import logspace
from trustlens.rules.registry import RULES, Anchor, Measure, Rule, RuleSpec, WeightKind, get_rule, resolve_rules

if TYPE_CHECKING:
    import torch

__all__ = [
    "RULES",
    "Anchor",
    "Measure",
    "Rule",
    "RuleSpec",
    "TokenInputs",
    "WeightKind",
    "decide",
    "evaluate",
    "evaluate_all",
    "get_rule",
    "require_inputs",
    "resolve_rules",
]

# what each optional input of `evaluate` holds, for error messages
_INPUT_DOCS = {
    "old_logp": "log π_old(a_t), the trainer's recomputation before the update",
    "topk_tv": "the top-K TV per token, from trustlens.divergence.topk_divergence",
    "topk_kl": "the top-K KL per token, from trustlens.divergence.topk_divergence",
}


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
        return logspace.ratio_distance(pi_logp, anchor_logp, xp)
    if measure == "binary_tv":
        return logspace.abs_diff_exp(pi_logp, anchor_logp, xp)
    return logspace.binary_kl(pi_logp, anchor_logp, eps, xp)


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

        from trustlens.core.checks import (
            broadcast_advantages,
            check_logp,
            check_nonnegative,
            check_same_device,
            check_same_shape,
            check_tv,
        )

        check_same_device(
            pi_logp=pi_logp,
            mu_logp=mu_logp,
            advantages=advantages,
            old_logp=old_logp,
            topk_tv=topk_tv,
            topk_kl=topk_kl,
        )
        self.pi_logp = check_logp("pi_logp", pi_logp).detach()
        # binary_kl reads log π = 0 as 1 − π = eps/2 of the (upcast) dtype: see logspace.binary_kl
        self.eps = _eps(self.pi_logp.dtype == torch.float64)
        self.mu_logp = check_logp("mu_logp", mu_logp).detach()
        self.old_logp = None if old_logp is None else check_logp("old_logp", old_logp).detach()
        self.given = {
            "old_logp": self.old_logp,
            "topk_tv": None if topk_tv is None else check_tv("topk_tv", topk_tv).detach(),
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
