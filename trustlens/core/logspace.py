"""Log-space math of the per-token quantities, written once for torch tensors and numpy arrays.

The functions take `xp`, the array namespace (the `torch` or the `numpy` module): both spell
exp, expm1, log, log1p, abs, where, maximum, minimum and zeros_like alike, so the rules (on
tensors) and the analyses (on recorded numpy columns, without torch) compute the same numbers from
the same lines; `derived_columns` applies them with numpy to float32 log-probs, for the recorder
and the reader alike. Inputs are log-probabilities ≤ 0; −inf (probability 0) is a valid value.
"""

from __future__ import annotations

from typing import Any

import numpy as np

LN2 = 0.6931471805599453

# Log-probabilities above this are rejected; those in (0, LOGP_TOLERANCE] are rounding noise of
# a log-softmax in low precision and are clamped to 0. Divergences below −LOGP_TOLERANCE are
# rejected likewise.
LOGP_TOLERANCE = 1e-4


def log1mexp(x: Any, xp: Any) -> Any:
    """log(1 − exp(x)) for x ≤ 0, exact at both ends (Mächler 2012): −inf at x = 0, 0 at x = −inf."""
    return xp.where(x > -LN2, xp.log(-xp.expm1(x)), xp.log1p(-xp.exp(x)))


def abs_diff_exp(a: Any, b: Any, xp: Any) -> Any:
    """|exp(a) − exp(b)| as exp(max)·(1 − exp(min − max)): exact relative precision when a ≈ b,
    no overflow for any a, b ≤ 0, and 0 when both are −inf."""
    hi, lo = xp.maximum(a, b), xp.minimum(a, b)
    out = xp.exp(hi) * -xp.expm1(lo - hi)
    return xp.where(hi == -float("inf"), xp.zeros_like(out), out)


def ratio_distance(pi_logp: Any, anchor_logp: Any, xp: Any) -> Any:
    """|π/anchor − 1| of the sampled token: +inf when anchor = 0 < π, NaN when both are 0."""
    return xp.abs(xp.expm1(pi_logp - anchor_logp))


def binary_kl(pi_logp: Any, mu_logp: Any, eps: float, xp: Any) -> Any:
    """KL(μ_bin ‖ π_bin) in nats over the buckets {a_t, rest}, ≥ 0 (see divergence.binary_kl).

    μ log(μ/π) + (1−μ)(log(1−μ) − log(1−π)). A bucket with μ = 0 adds 0 (0 log 0 = 0); one with
    μ > 0 = π makes the KL +inf. log π = 0 exactly is read as 1 − π = eps/2 (eps: the machine
    epsilon of the input's dtype): a log-softmax over finite logits rounds to 0 once π > 1 − eps,
    and reading it as π = 1 would make the KL +inf for every confident token.
    """
    pi_logp = xp.where(pi_logp == 0, xp.zeros_like(pi_logp) - eps / 2, pi_logp)  # log(1 − eps/2)
    mu = xp.exp(mu_logp)
    rest_mu = -xp.expm1(mu_logp)  # 1 − μ, exact near μ = 1
    on_token = xp.where(mu > 0, mu * (mu_logp - pi_logp), xp.zeros_like(mu))
    rest = xp.where(rest_mu > 0, rest_mu * (log1mexp(mu_logp, xp) - log1mexp(pi_logp, xp)), xp.zeros_like(mu))
    return xp.maximum(on_token + rest, xp.zeros_like(mu))


def derived_columns(pi_logp: np.ndarray, anchor_logp: np.ndarray) -> dict[str, np.ndarray]:
    """The token columns that follow from the sampled token's float32 log-probs under π and its
    anchor (μ, else π_old): ratio π/anchor, binary_tv and binary_kl (nats), float32, computed in
    float32 with numpy. One computation for the recorder (full runs store them) and the reader
    (sampled runs derive them), so that both give the same bits from the same stored columns."""
    pi, anchor = pi_logp.astype(np.float32, copy=False), anchor_logp.astype(np.float32, copy=False)
    eps = float(np.finfo(np.float32).eps)
    with np.errstate(all="ignore"):
        values = {
            "ratio": np.exp(pi - anchor),
            "binary_tv": abs_diff_exp(pi, anchor, np),
            "binary_kl": binary_kl(pi, anchor, eps, np),
        }
    return {k: v.astype(np.float32, copy=False) for k, v in values.items()}
