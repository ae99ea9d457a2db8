"""The built-in corrections beyond the token trust regions of trustlens.rules.registry (docs/rules.md
gives each one's formula, default, source and verl/TRL name):

- `icepop`: IcePop (Ring-1T): no gradient for tokens whose π_old/μ leaves [0.5, 5], either side.
- `dual_clip`: dual-clip PPO (Ye et al. 2020): PPO's clip, and no gradient for A < 0 tokens whose
  π/μ > c = 3.
- `gspo`: GSPO (Qwen3): the response's geometric-mean ratio s = (Π_t π/π_old)^(1/|y|) clipped to
  [1 − 3e-4, 1 + 4e-4], weight s.
- `gmpo`: GMPO: token log-ratios log(π/π_old) clipped to [−0.4, 0.4], weight the geometric mean of
  the clipped ratios.
- verl's rollout correction on π_old/μ: `rs_token`, `rs_seq` (the product over the response),
  `rs_geo` (the geometric mean) reject outside [1 − low, 1 + high]; `grpo_seq_tis` weights the
  PPO clip against π_old by the sequence-level truncated IS weight min(Π_t π_old/μ, 2).
- batch rules (trustlens.rules.batch), by cov_t = (log π_t − mean log π)(A_t − mean A) over the
  batch: `clip_cov` (Clip-Cov): PPO's clip against π_old, and no gradient for a seeded random
  share 2e-4 of the tokens with 1 < cov < 5; `kl_cov` (KL-Cov): the penalty |log π − log π_old|
  (coefficient 1) on the top share 2e-4 of the tokens by cov.

Imports no torch.
"""

from __future__ import annotations

from trustlens.rules.rule import Rule


def _rejection(name: str, statistic, low: float, high: float, what: str) -> Rule:
    return Rule(
        name,
        low,
        high,
        "mu",
        "ratio",
        f"verl rollout correction: reject {what} whose π_old/μ leaves [1 − low, 1 + high]",
        statistic=statistic,
        sides="both",
        policy="old",
    )


CORRECTIONS: tuple[Rule, ...] = (
    Rule(
        "icepop",
        0.5,
        4.0,
        "mu",
        "ratio",
        "IcePop: no gradient for tokens whose π_old/μ leaves [1 − low, 1 + high] = [0.5, 5]",
        sides="both",
        policy="old",
    ),
    Rule(
        "dual_clip",
        0.2,
        0.2,
        "mu",
        "ratio",
        "dual-clip PPO: PPO's ratio clip, and no gradient for A < 0 tokens whose π/μ > c = 3",
        dual_clip=3.0,
    ),
    Rule(
        "gspo",
        3e-4,
        4e-4,
        "old",
        "ratio",
        "GSPO: block a response whose geometric-mean ratio (Π π/π_old)^(1/|y|) leaves [1 − low, 1 + high]",
        weight="seq_ratio",
        statistic="mean",
    ),
    Rule(
        "gmpo",
        0.4,
        0.4,
        "old",
        "log_ratio",
        "GMPO: clip log(π/π_old) to [−low, high]; weight the geometric mean of the clipped ratios",
        weight="geo_mean",
    ),
    _rejection("rs_token", None, 0.5, 1.0, "tokens"),
    _rejection("rs_seq", "sum", 0.5, 1.0, "responses (product of the token ratios)"),
    _rejection("rs_geo", "mean", 1e-3, 1e-3, "responses (geometric mean of the token ratios)"),
    Rule(
        "grpo_seq_tis",
        0.2,
        0.2,
        "old",
        "ratio",
        "GRPO ratio clip vs π_old, times the sequence-level truncated IS weight min(Π π_old/μ, C_tis)",
        weight="seq_tis",
        tis_cap=2.0,
    ),
    Rule(
        "clip_cov",
        0.2,
        0.2,
        "old",
        "ratio",
        "Clip-Cov: PPO's clip vs π_old, and no gradient for a random share cov_ratio of the batch's "
        "tokens with cov(log π, A) in (cov_low, cov_high)",
        cov="clip",
        cov_ratio=2e-4,
        cov_low=1.0,
        cov_high=5.0,
    ),
    Rule(
        "kl_cov",
        None,
        None,
        "old",
        None,
        "KL-Cov: the penalty kl_coef·|log π − log π_old| on the top share cov_ratio of the batch's "
        "tokens by cov(log π, A)",
        cov="kl",
        cov_ratio=2e-4,
        kl_coef=1.0,
    ),
)

__all__ = ["CORRECTIONS"]
