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
carries no gradient and is never blocked. A rule with `sides="both"` (IcePop, verl's rejection
masks) drops the advantage's direction: it blocks every A ≠ 0 token outside the region. A rule
with `dual_clip=c` also blocks A < 0 tokens with π/anchor > c. A rule with `policy="old"`
measures π_old instead of π against its anchor μ. A sequence rule (`statistic`) decides all the
tokens of a response from its sequence ratio s (trustlens.rules.sequence) in place of π/anchor. A
batch rule (Clip-Cov, KL-Cov: trustlens.rules.batch) selects a share of a batch's response tokens
by the covariance of log π and A.
The distances (`Rule.measure`):

    ratio       |π/anchor − 1|        (so PPO's "ratio > 1 + high" / "ratio < 1 − low")
    log_ratio   |log(π/anchor)|       nats (GMPO's clip in log space)
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

Every name is importable from trustlens.rules: `Rule` is defined in trustlens.rules.rule, `RULES`
and `get_rule` in trustlens.rules.registry, `resolve_rules` in trustlens.rules.resolve; the
decision, its dispatch over a rule's level (`RuleInputs.blocked`, for torch and numpy) and its
evaluation on tensors here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from trustlens.core import logspace
from trustlens.rules.batch import batch_seed, select
from trustlens.rules.registry import get_rule
from trustlens.rules.resolve import RuleSpec, resolve_rules
from trustlens.rules.rule import Anchor, Rule
from trustlens.rules.sequence import sequence_log_ratio, sequence_statistics

if TYPE_CHECKING:
    import torch

__all__ = ["RuleInputs", "TokenInputs", "decide", "decide_sequence", "evaluate", "evaluate_all", "require_inputs"]

# what each optional input of `evaluate` holds, for error messages
_INPUT_DOCS = {
    "old_logp": "log π_old(a_t), the trainer's recomputation before the update",
    "topk_tv": "the top-K TV per token, from trustlens.divergence.topk_divergence",
    "topk_kl": "the top-K KL per token, from trustlens.divergence.topk_divergence",
    "response_mask": "(B, T) which positions are response tokens: sequence rules sum, batch rules centre over them",
}


def decide(rule: Rule, d: Any, pi_logp: Any, anchor_logp: Any, advantages: Any) -> Any:
    """The one definition of blocking (module docstring), on torch tensors or numpy arrays alike.

    d: the rule's distance per token; pi_logp, anchor_logp: log π(a_t) (log π_old(a_t) for a
    rule of policy "old"; log s for a sequence rule), log anchor(a_t) (0 for a sequence rule);
    advantages: A per token. A NaN distance (π and anchor both 0) blocks nothing, +inf is beyond
    every threshold. Returns a bool array of their shape, True = blocked; all False for a rule
    that never blocks.
    """
    if not rule.blocks:
        return (pi_logp > 0) & (pi_logp < 0)  # all False, as a bool array of pi_logp's kind and device
    if rule.sides == "push":
        up, down = advantages > 0, advantages < 0
    else:
        up = down = advantages != 0
    blocked = (up & (pi_logp > anchor_logp) & (d > rule.high)) | (down & (pi_logp < anchor_logp) & (d > rule.low))
    if rule.dual_clip is not None:
        blocked = blocked | ((advantages < 0) & (pi_logp - anchor_logp > math.log(rule.dual_clip)))
    return blocked


def decide_sequence(rule: Rule, log_s: Any, advantages: Any, xp: Any) -> Any:
    """`decide` for a sequence rule from log s per token (its response's; trustlens.rules.sequence):
    d = |s − 1|, s against 1. A NaN log s (a response with a token both policies give probability
    0) blocks nothing."""
    zero = xp.zeros_like(log_s)
    return decide(rule, logspace.ratio_distance(log_s, zero, xp), log_s, zero, advantages)


def _distance(measure: str, pi_logp: Any, anchor_logp: Any, eps: float, xp: Any) -> Any:
    """d(π, anchor) of a computed measure (ratio, binary TV/KL) per token, in namespace xp."""
    if measure == "ratio":
        return logspace.ratio_distance(pi_logp, anchor_logp, xp)
    if measure == "log_ratio":
        return xp.abs(pi_logp - anchor_logp)
    if measure == "binary_tv":
        return logspace.abs_diff_exp(pi_logp, anchor_logp, xp)
    return logspace.binary_kl(pi_logp, anchor_logp, eps, xp)


class RuleInputs:
    """The per-token inputs of the rules in one array namespace, and the one dispatch over a
    rule's level (`blocked`: token, sequence or batch), shared by torch (`TokenInputs`) and numpy
    (`trustlens.rules.columns.ColumnInputs`). Each computed distance is kept in `distances`, so
    that rules sharing it compute it once. A subclass sets the attributes and reads its inputs in
    `anchor_logp`, `divergence`, `statistic` and `batch_selection`."""

    xp: Any  # the array namespace: torch or numpy
    eps: float  # binary_kl's reading of log π = 0 as 1 − π = eps/2 (see logspace.binary_kl)
    pi_logp: Any  # log π(a_t) per token
    advantages: Any  # A per token
    distances: dict[tuple[str, str, str], Any]  # d per token by (measure, anchor key, policy)

    def anchor_logp(self, anchor: Anchor) -> Any:
        """log anchor(a_t) per token: log μ(a_t) or log π_old(a_t)."""
        raise NotImplementedError

    def anchor_key(self, anchor: Anchor) -> str:
        """What keys the distances from `anchor` in `distances`."""
        return anchor

    def divergence(self, measure: str) -> Any:
        """The given top-K divergence ("topk_tv" or "topk_kl") per token."""
        raise NotImplementedError

    def statistic(self, name: str) -> Any:
        """The per-response statistic `name` (trustlens.rules.sequence.SEQUENCE_COLUMNS), float64."""
        raise NotImplementedError

    def batch_selection(self, rule: Rule, clipped: Any | None) -> Any:
        """A batch rule's selection (trustlens.rules.batch) per token, with the tokens `clipped`
        (Clip-Cov's PPO clip; None for KL-Cov) blocked too."""
        raise NotImplementedError

    def policy_logp(self, rule: Rule) -> Any:
        """The numerator of the rule's ratio per token: log π, or log π_old (policy "old")."""
        return self.pi_logp if rule.policy == "pi" else self.anchor_logp("old")

    def distance(self, rule: Rule) -> Any:
        """d(policy, anchor) of `rule` per token."""
        if rule.measure in ("topk_tv", "topk_kl"):
            return self.divergence(rule.measure)
        key = (str(rule.measure), self.anchor_key(rule.anchor), rule.policy)
        if key not in self.distances:
            num, anchor = self.policy_logp(rule), self.anchor_logp(rule.anchor)
            self.distances[key] = _distance(key[0], num, anchor, self.eps, self.xp)
        return self.distances[key]

    def sequence_log_ratio(self, rule: Rule) -> Any:
        """log s of a sequence rule per row (trustlens.rules.sequence), float64."""
        return sequence_log_ratio(rule, self.statistic)

    def blocked(self, rule: Rule) -> Any:
        """The bool mask of the tokens `rule` blocks (True = no gradient): `decide` on the token's
        distance (token rules), on its response's sequence ratio (sequence rules), or the batch
        rule's selection."""
        if not rule.blocks:
            return decide(rule, None, self.pi_logp, None, None)
        if rule.level == "sequence":
            return decide_sequence(rule, self.sequence_log_ratio(rule), self.advantages, self.xp)
        if rule.level == "batch":
            return self.batch_selection(rule, self.token_blocked(rule) if rule.cov == "clip" else None)
        return self.token_blocked(rule)

    def token_blocked(self, rule: Rule) -> Any:
        """`decide` on the rule's distance of each token from its anchor."""
        num, anchor = self.policy_logp(rule), self.anchor_logp(rule.anchor)
        return decide(rule, self.distance(rule), num, anchor, self.advantages)


class TokenInputs(RuleInputs):
    """The per-token inputs of the rules on torch tensors, checked once: upcast to float32+,
    detached, advantages broadcast to the token shape. Caches the quantities several rules share
    (the distance of π from each anchor, the per-response statistics), so that evaluating many
    rules costs each once."""

    def __init__(
        self,
        *,
        pi_logp: torch.Tensor,  # (B, T) or any shape: log π(a_t)
        mu_logp: torch.Tensor,  # same shape: log μ(a_t)
        advantages: torch.Tensor,  # (B,) per sequence or the token shape
        old_logp: torch.Tensor | None = None,  # token shape: log π_old(a_t)
        topk_tv: torch.Tensor | None = None,  # token shape
        topk_kl: torch.Tensor | None = None,  # token shape; +inf allowed
        response_mask: torch.Tensor | None = None,  # (B, T): the tokens of each response (sequence rules)
        seed: tuple[int, int] = (0, 0),  # the batch's (step, update): seeds Clip-Cov's draw
    ) -> None:
        import torch

        from trustlens.core.tensor_checks import (
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
        self.xp = torch
        self.pi_logp = check_logp("pi_logp", pi_logp).detach()
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
        self.response_mask = None
        if response_mask is not None:
            from trustlens.core.tensor_checks import check_mask

            if self.pi_logp.dim() != 2:
                raise ValueError(f"pi_logp must have shape (B, T) with response_mask, got {tuple(self.pi_logp.shape)}")
            self.response_mask = check_mask("response_mask", response_mask, self.pi_logp)
        self.seed = batch_seed(*seed)
        self.distances = {}
        self._sums: dict[str, torch.Tensor | None] = {}

    def require(self, rule: Rule) -> None:
        """ValueError naming the rule and the argument when an input `rule` needs is missing."""
        given = {k: v is not None for k, v in self.given.items()}
        require_inputs(rule, given | {"response_mask": self.response_mask is not None})

    def anchor_logp(self, anchor: Anchor) -> torch.Tensor:
        out = self.mu_logp if anchor == "mu" else self.old_logp
        assert out is not None  # `require` checked it
        return out

    def divergence(self, measure: str) -> torch.Tensor:
        given = self.given[measure]
        assert given is not None  # `require` checked it
        return given

    def sequence_sums(self) -> dict[str, torch.Tensor | None]:
        """The per-response statistics of trustlens.rules.sequence as (B, 1) float64 tensors:
        seq_logratio_mu, seq_logratio_old (None without π_old), seq_tokens."""
        if not self._sums:
            import torch

            mask = self.response_mask
            assert mask is not None  # `require` checked it

            def over_response(values: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, 1)
                return torch.where(mask, values, torch.zeros_like(values)).sum(dim=1, keepdim=True)

            old = None if self.old_logp is None else self.old_logp.double()
            tokens = mask.sum(dim=1, keepdim=True).double()
            self._sums = sequence_statistics(self.pi_logp.double(), self.mu_logp.double(), old, over_response, tokens)
        return self._sums

    def statistic(self, name: str) -> torch.Tensor:
        value = self.sequence_sums()[name]
        assert value is not None  # `require` checked old_logp for the rules that read it
        return value

    def sequence_log_ratio(self, rule: Rule) -> torch.Tensor:
        """log s of `rule` (trustlens.rules.sequence), float64, broadcast to the token shape."""
        return super().sequence_log_ratio(rule).expand_as(self.pi_logp)

    def blocked(self, rule: Rule) -> torch.Tensor:
        """The bool mask of tokens `rule` blocks (True = no gradient), token shape; ValueError
        for an input the rule needs that is missing."""
        self.require(rule)
        return super().blocked(rule)

    def batch_selection(self, rule: Rule, clipped: torch.Tensor | None) -> torch.Tensor:
        """The selection over the response tokens, token shape."""
        mask = self.response_mask
        assert mask is not None  # `require` checked it
        pick = select(
            rule,
            self.pi_logp[mask].double().cpu().numpy(),
            self.advantages[mask].double().cpu().numpy(),
            None if clipped is None else clipped[mask].cpu().numpy(),
            self.seed,
        )
        import torch

        out = torch.zeros_like(mask)
        out[mask] = torch.from_numpy(pick).to(mask.device)
        return out if clipped is None else out | (clipped & mask)


def require_inputs(rule: Rule, given: Mapping[str, bool]) -> None:
    """ValueError naming the rule and the argument when an input `rule` needs is not `given`
    ({"old_logp" | "topk_tv" | "topk_kl" | "response_mask": whether it is given; one left out
    is not given})."""
    for arg in rule.needs:
        if not given.get(arg, False):
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
    response_mask: torch.Tensor | None = None,
    low: float | None = None,
    high: float | None = None,
    seed: tuple[int, int] = (0, 0),
) -> torch.Tensor:
    """Which tokens `rule` blocks: a bool tensor of pi_logp's shape, True = blocked.

    `rule` is a name from `RULES` or a `Rule`; `low` / `high` override its thresholds (None keeps
    the rule's default). `advantages` is per sequence (B,) or per token like pi_logp; tokens with
    A = 0 are never blocked. `response_mask` (B, T) marks each response's tokens: a sequence rule
    needs it, to sum over them, and a batch rule, to centre over them; `seed`, the batch's (step,
    update), seeds Clip-Cov's random draw (trustlens.rules.batch). Log-probabilities may be −inf
    and topk_kl +inf. Raises KeyError for an unknown rule, ValueError for an input the rule needs
    that is missing, for mismatched shapes, NaN, positive log-probabilities or negative
    divergences.
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
        response_mask=response_mask,
        seed=seed,
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
    response_mask: torch.Tensor | None = None,
    seed: tuple[int, int] = (0, 0),
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
        response_mask=response_mask,
        seed=seed,
    )
    for rule in resolved:
        inputs.require(rule)
    return {rule.name: inputs.blocked(rule) for rule in resolved}
