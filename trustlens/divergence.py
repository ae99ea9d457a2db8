"""Divergences between the rollout policy μ and the trained policy π, per token.

All inputs are log-probabilities or logits; every result is computed in float32 or wider in log
space, so that probabilities near 0 and near 1 keep their precision. Units: TV is a probability
mass in [0, 1]; KL is in nats.

Binary forms look at two buckets per position, {a_t, everything else}:
    binary_tv = |π(a_t) − μ(a_t)|
    binary_kl = μ log(μ/π) + (1−μ) log((1−μ)/(1−π))          = KL(μ_bin ‖ π_bin)
"""

from __future__ import annotations

import torch

from trustlens._checks import check_logp, check_same_shape


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 − exp(x)) for x ≤ 0, exact at both ends (Mächler 2012): −inf at x = 0."""
    return torch.where(x > -0.6931471805599453, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def binary_tv(pi_logp: torch.Tensor, mu_logp: torch.Tensor) -> torch.Tensor:
    """|π(a_t) − μ(a_t)| from log-probabilities of the sampled tokens; any shape, float32+."""
    pi_logp, mu_logp = check_logp("pi_logp", pi_logp), check_logp("mu_logp", mu_logp)
    check_same_shape(pi_logp=pi_logp, mu_logp=mu_logp)
    # μ·|exp(log π − log μ) − 1| keeps relative precision when π ≈ μ.
    return torch.exp(mu_logp) * torch.expm1(pi_logp - mu_logp).abs()


def binary_kl(pi_logp: torch.Tensor, mu_logp: torch.Tensor) -> torch.Tensor:
    """KL(μ_bin ‖ π_bin) in nats over the buckets {a_t, rest}; any shape, float32+.

    μ log(μ/π) + (1−μ)(log(1−μ) − log(1−π)), with log(1−p) from `log1mexp`; a bucket with
    μ = 1 exactly contributes 0 (0 log 0 = 0) and the result is clamped at 0 against rounding.
    """
    pi_logp, mu_logp = check_logp("pi_logp", pi_logp), check_logp("mu_logp", mu_logp)
    check_same_shape(pi_logp=pi_logp, mu_logp=mu_logp)
    mu = torch.exp(mu_logp)
    rest_mu = -torch.expm1(mu_logp)  # 1 − μ, exact near μ = 1
    rest = rest_mu * (log1mexp(mu_logp) - log1mexp(pi_logp))
    rest = torch.where(rest_mu > 0, rest, torch.zeros_like(rest))
    return (mu * (mu_logp - pi_logp) + rest).clamp(min=0.0)
