"""The policy loss of docs/rules.md: one form that trains under any trust-region rule.

Per valid token (b, t), with sg the stop-gradient and `blocked` from trustlens.rules:

    ℓ_bt = −A_bt · sg(w_bt) · (1 − blocked_bt) · log π(a_t)

The weight w depends on the rule (C = clip_ratio_c, default 10):

    default (ppo, ppo_clip_higher, minirl, dppo_*, pg_is,
             icepop, dual_clip, rs_*, clip_cov, kl_cov)      w = min(π/μ, C)
    cispo     (never blocks)                                 w = min(π/μ, 1 + high)
    grpo_tis  (blocked by the PPO clip against π_old)        w = min(π/π_old, C)·min(π_old/μ, C_tis)
    grpo_seq_tis                                             w = min(π/π_old, C)·min(Π_y π_old/μ, C_tis)
    gspo      (weight "seq_ratio")                           w = min(s, C), s = (Π_y π/π_old)^(1/|y|)
    gmpo      (weight "geo_mean")                            w = min(exp((1/|y|) Σ_y clip_A(log π/π_old)), C)

with C_tis = `Rule.tis_cap` (2 by default), Π_y / Σ_y over the tokens of the token's response y,
and clip_A GMPO's sign-dependent clip: min(·, high) for A > 0, max(·, −low) for A < 0 (a token
whose log-ratio it clips is the one `gmpo` blocks). With `seq-mean-token-mean` aggregation the
gradient of gspo is GSPO's (−A·s/|y| per token inside the band) and that of gmpo is GMPO's.
KL-Cov (`kl_cov`) blocks nothing: the tokens its `blocked` marks (trustlens.rules.batch) keep their
gradient and add its penalty kl_coef·|log π − log π_old|, so there

    ℓ_bt = (−A_bt · sg(w_bt) + kl_coef · sign(log π − log π_old)_bt) · log π(a_t)

whose gradient is that of verl's −A·r + kl_coef·|log r| (r = π/π_old, w = r with μ = π_old).
Only pi_logp carries a gradient: ∂ℓ/∂log π(a_t) =
−A·w·(1 − blocked) for every other rule. Since ∂(π/μ)/∂log π = π/μ, for `ppo` this is exactly the gradient of the
textbook clipped surrogate −min(r·A, clip(r, 1 − low, 1 + high)·A), r = π/μ, at every token with
r ≤ C. At r > C the two differ only for A < 0 (with A > 0 such a token is blocked, as C > 1 + high):
there this loss keeps the truncated gradient −A·C, where the textbook surrogate gives −A·r and
dual-clip PPO (Ye et al. 2020, same C) gives 0. The value of ℓ is not the surrogate's value; only
its gradient is meaningful.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

from trustlens.core.tensor_checks import upcast
from trustlens.core.torch_import import torch
from trustlens.rules import Rule, TokenInputs, WeightKind, get_rule

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum-norm", "seq-mean-token-mean")


@dataclass(frozen=True)
class PolicyLoss:
    """What `policy_loss` returns. Fractions are detached 0-dim tensors, NaN when no token
    falls in their group."""

    loss: torch.Tensor  # scalar; backpropagates to pi_logp only
    blocked: torch.Tensor  # (B, T) bool: the rule blocked this valid token (False on padding)
    weight: torch.Tensor  # (B, T) the detached weight w of each token
    blocked_frac: torch.Tensor  # blocked share of the valid tokens with A ≠ 0 (A = 0 is never blocked)
    blocked_frac_pos: torch.Tensor  # blocked share of the valid tokens with A > 0
    blocked_frac_neg: torch.Tensor  # blocked share of the valid tokens with A < 0
    zero_frac: torch.Tensor  # share of the valid tokens with A = 0 (no gradient, never blocked)


def _ratio_weight(rule: Rule, x: TokenInputs, log_c: float) -> torch.Tensor:
    """The default weight w = min(π/μ, C)."""
    return _capped_exp(x.pi_logp - x.mu_logp, log_c)


def _cispo_weight(rule: Rule, x: TokenInputs, log_c: float) -> torch.Tensor:
    """CISPO's w = min(π/μ, 1 + high)."""
    assert rule.high is not None  # Rule requires it for the cispo weight
    return _capped_exp(x.pi_logp - x.mu_logp, math.log1p(rule.high))


def _tis_weight(rule: Rule, x: TokenInputs, log_c: float) -> torch.Tensor:
    """grpo_tis's w = min(π/π_old, C)·min(π_old/μ, C_tis)."""
    old = x.anchor_logp("old")
    return _truncated_is(rule, x, log_c, old - x.mu_logp)


def _seq_tis_weight(rule: Rule, x: TokenInputs, log_c: float) -> torch.Tensor:
    """grpo_seq_tis's w = min(π/π_old, C)·min(Π_y π_old/μ, C_tis)."""
    old = x.anchor_logp("old")
    log_is = x.statistic("seq_logratio_mu") - x.statistic("seq_logratio_old")  # Σ_y log(π_old/μ), (B, 1)
    return _truncated_is(rule, x, log_c, log_is.to(old.dtype).expand_as(old))


def _truncated_is(rule: Rule, x: TokenInputs, log_c: float, log_is: torch.Tensor) -> torch.Tensor:
    """min(π/π_old, C)·min(exp(log_is), C_tis)."""
    assert rule.tis_cap is not None  # Rule requires it for the tis weights
    return _capped_exp(x.pi_logp - x.anchor_logp("old"), log_c) * _capped_exp(log_is, math.log(rule.tis_cap))


def _seq_ratio_weight(rule: Rule, x: TokenInputs, log_c: float) -> torch.Tensor:
    """GSPO's w = min(s, C), s the rule's sequence ratio."""
    return _capped_exp(x.sequence_log_ratio(rule).to(x.pi_logp.dtype), log_c)


def _geo_mean_weight(rule: Rule, x: TokenInputs, log_c: float) -> torch.Tensor:
    """GMPO's w = min(exp((1/|y|) Σ_y clip_A(log π/π_old)), C)."""
    return _capped_exp(_geo_mean_log_ratio(rule, x), log_c)


# The weight w of each weight kind (module docstring): (rule, inputs, log C) -> (B, T), from
# log-ratios clamped before exp (no overflow).
WEIGHTS: dict[WeightKind, Callable[[Rule, TokenInputs, float], torch.Tensor]] = {
    "ratio": _ratio_weight,
    "cispo": _cispo_weight,
    "tis": _tis_weight,
    "seq_tis": _seq_tis_weight,
    "seq_ratio": _seq_ratio_weight,
    "geo_mean": _geo_mean_weight,
}


def _geo_mean_log_ratio(rule: Rule, x: TokenInputs) -> torch.Tensor:
    """GMPO's log weight per token: the mean over the token's response of the log-ratios
    log(π/anchor) clipped by the sign of A (min(·, high) for A > 0, max(·, −low) for A < 0),
    broadcast to (B, T)."""
    assert rule.low is not None and rule.high is not None and x.response_mask is not None  # Rule requires them
    log_r = x.pi_logp - x.anchor_logp(rule.anchor)  # (B, T)
    a = x.advantages
    clipped = torch.where(a > 0, log_r.clamp(max=rule.high), torch.where(a < 0, log_r.clamp(min=-rule.low), log_r))
    mask = x.response_mask
    total = torch.where(mask, clipped, torch.zeros_like(clipped)).sum(dim=1, keepdim=True)
    return (total / mask.sum(dim=1, keepdim=True).clamp(min=1)).expand_as(log_r)


def _capped_exp(log_ratio: torch.Tensor, log_cap: float) -> torch.Tensor:
    """min(exp(log_ratio), exp(log_cap)), clamped before exp (no overflow); a NaN log-ratio (both
    log-probs −inf: a token neither policy can produce) gives weight 0."""
    return torch.exp(log_ratio.clamp(max=log_cap)).nan_to_num(nan=0.0)


def _fraction(blocked: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    return (blocked & group).sum().double() / group.sum().double()


def policy_loss(
    rule: str | Rule,
    *,
    pi_logp: torch.Tensor,  # (B, T) log π(a_t), carries the gradient
    mu_logp: torch.Tensor,  # (B, T) log μ(a_t)
    advantages: torch.Tensor,  # (B,) per sequence or (B, T) per token
    response_mask: torch.Tensor,  # (B, T) bool or 0/1: which positions are response tokens
    old_logp: torch.Tensor | None = None,  # (B, T) log π_old(a_t)
    topk_tv: torch.Tensor | None = None,  # (B, T)
    topk_kl: torch.Tensor | None = None,  # (B, T)
    low: float | None = None,
    high: float | None = None,
    clip_ratio_c: float = 10.0,
    loss_agg_mode: str = "token-mean",
    seed: tuple[int, int] = (0, 0),  # the batch's (step, update): seeds Clip-Cov's draw
) -> PolicyLoss:
    """The loss of the module docstring under `rule`, aggregated over the valid tokens m_bt:

        token-mean               Σ_bt m·ℓ / Σ_bt m                (0 when no token is valid)
        seq-mean-token-sum-norm  Σ_bt m·ℓ / (B·T), T = response_mask.shape[-1]: the mean over
                                 sequences of each one's token sum, divided by a constant — verl's
                                 (Dr. GRPO's) convention; pad responses to the generation budget
                                 so that T stays constant across steps.
        seq-mean-token-mean      the mean over the responses with a valid token of each one's
                                 token mean Σ_t m·ℓ / Σ_t m (GSPO's and GMPO's aggregation).

    `rule`, `low`, `high` and the inputs are as in `trustlens.rules.decision`; everything but
    pi_logp is detached. Raises KeyError for an unknown rule and ValueError for bad input.
    """
    rule = get_rule(rule).with_thresholds(low, high)
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {', '.join(LOSS_AGG_MODES)}; got {loss_agg_mode!r}")
    if not isinstance(clip_ratio_c, numbers.Real) or not math.isfinite(clip_ratio_c) or clip_ratio_c <= 1:
        raise ValueError(f"clip_ratio_c must be a finite number > 1, got {clip_ratio_c!r}")
    if isinstance(pi_logp, torch.Tensor) and pi_logp.dim() != 2:
        raise ValueError(f"pi_logp must have shape (B, T), got {tuple(pi_logp.shape)}")
    x = TokenInputs(  # checks every input once
        pi_logp=pi_logp,
        mu_logp=mu_logp,
        advantages=advantages,
        old_logp=old_logp,
        topk_tv=topk_tv,
        topk_kl=topk_kl,
        response_mask=response_mask,
        seed=seed,
    )
    pi = upcast(pi_logp).clamp(max=0.0)  # the differentiable log π, its values checked above
    mask = x.response_mask
    assert mask is not None  # given above
    blocked = x.blocked(rule) & mask
    weight = WEIGHTS[rule.weight](rule, x, math.log(clip_ratio_c))
    penalised = rule.cov == "kl"  # KL-Cov's marked tokens keep their gradient and add a penalty
    coef = -(x.advantages * weight * (mask & ~(blocked & ~penalised)).to(pi.dtype))  # (B, T), detached
    if penalised:
        assert rule.kl_coef is not None  # Rule requires it for KL-Cov
        coef = coef + rule.kl_coef * torch.sign(x.pi_logp - x.anchor_logp("old")).nan_to_num(0.0) * blocked
    # a token with coefficient 0 adds 0, also where log π = −inf (π gives it probability 0)
    per_token = torch.where(coef != 0, coef * pi, torch.zeros_like(pi))  # (B, T)
    if loss_agg_mode == "token-mean":
        loss = per_token.sum() / mask.sum().clamp(min=1)
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        loss = per_token.sum() / mask.numel()
    else:
        lengths = mask.sum(dim=1)  # (B,)
        loss = (per_token.sum(dim=1) / lengths.clamp(min=1)).sum() / (lengths > 0).sum().clamp(min=1)
    zero = mask & (x.advantages == 0)
    return PolicyLoss(
        loss=loss,
        blocked=blocked,
        weight=weight,
        blocked_frac=_fraction(blocked, mask & ~zero),
        blocked_frac_pos=_fraction(blocked, mask & (x.advantages > 0)),
        blocked_frac_neg=_fraction(blocked, mask & (x.advantages < 0)),
        zero_frac=_fraction(zero, mask),
    )
