"""The batch-level rules of docs/rules.md: Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy
Mechanism of Reinforcement Learning for Reasoning Language Models"; verl's `clip_cov` and
`kl_cov` policy losses), which select tokens by how much each one's update moves the entropy.

Over the N response tokens of one batch (one `record` call, one `policy_loss` call), in float64:

    cov_t = (log π_t − mean_N log π) · (A_t − mean_N A)

(the means over all N response tokens, A = 0 ones included, as verl takes them; a token of
log π = −inf, probability 0, has no covariance: the means are over the others, and it is never
selected), and with k = max(⌊cov_ratio · N⌋, 1):

    clip  (Clip-Cov)  the candidates are the tokens PPO's clip against π_old does not block with
                      cov_low < cov_t < cov_high; k of them (all when fewer) are drawn at random,
                      and get no gradient
    kl    (KL-Cov)    the k tokens of largest cov_t get the penalty kl_coef·|log π − log π_old|

Both then leave the A = 0 tokens out of the decision (`blocked_<rule>`): a Clip-Cov token
without advantage has no gradient to stop; verl would give a KL-Cov one a penalty, trustlens
does not (A = 0 is never blocked, for every rule). The random draw is seeded by `seed`, the
(step, update) the batch belongs to, so that the same batch is always decided alike (verl draws
with torch's global generator). Imports no torch.
"""

from __future__ import annotations

import numpy as np

from trustlens.rules.rule import Rule


def covariance(logp: np.ndarray, advantages: np.ndarray) -> np.ndarray:
    """cov_t of the module docstring per token: (N,) float64 from the (N,) log π and A of the
    batch's response tokens; NaN where log π = −inf, the means taken over the other tokens (one
    −inf in the mean would make every token's deviation infinite)."""
    logp, advantages = np.asarray(logp, np.float64), np.asarray(advantages, np.float64)
    finite = np.isfinite(logp)  # (N,)
    cov = np.full(len(logp), np.nan)
    if finite.any():
        lp, a = logp[finite], advantages[finite]
        cov[finite] = (lp - lp.mean()) * (a - a.mean())
    return cov


def select(
    rule: Rule,
    logp: np.ndarray,  # (N,) log π(a_t) of the batch's response tokens, row-major (b, t) order
    advantages: np.ndarray,  # (N,) A per token
    clipped: np.ndarray | None,  # (N,) bool: PPO's clip against π_old blocks it (Clip-Cov only)
    seed: tuple[int, int],  # the batch's (step, update): seeds Clip-Cov's draw
) -> np.ndarray:
    """The tokens the batch rule `rule` selects (module docstring): a (N,) bool array, True =
    blocked (Clip-Cov) or penalised (KL-Cov); False for every A = 0 token."""
    n = len(logp)
    out = np.zeros(n, dtype=bool)
    if n == 0:
        return out
    assert rule.cov_ratio is not None  # Rule requires it for a batch rule
    cov = covariance(logp, advantages)
    k = max(int(rule.cov_ratio * n), 1)
    if rule.cov == "kl":
        ranked = np.flatnonzero(~np.isnan(cov))  # a NaN cov (log π = −inf) is never selected
        out[ranked[np.argsort(-cov[ranked], kind="stable")[:k]]] = True
    else:
        assert clipped is not None and rule.cov_low is not None and rule.cov_high is not None
        # a NaN cov (log π = −inf) is no candidate: its comparisons are False
        candidates = np.flatnonzero(~clipped & (cov > rule.cov_low) & (cov < rule.cov_high))
        draw = np.random.default_rng([int(s) for s in seed]).permutation(len(candidates))
        out[candidates[draw[:k]]] = True
    return out & (np.asarray(advantages) != 0)


def batch_seed(step: int, update: int) -> tuple[int, int]:
    """The seed of the batch of (step, update), checked: two integers ≥ 0."""
    for name, value in (("step", step), ("update", update)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"seed: {name} must be an integer ≥ 0 (the batch's {name}), got {value!r}")
    return int(step), int(update)


__all__ = ["batch_seed", "covariance", "select"]
