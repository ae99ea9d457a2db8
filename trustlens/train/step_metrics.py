"""The metrics the built-in trainer (trustlens.train.trainer) logs for each step besides its
rewards and losses: how far the engine's μ is from the trainer's π_old on the step's tokens
(`mismatch_metrics`), and each rule's block rate among the tokens with A > 0 and with A < 0
(`BlockedCounter`). Each is `Pooled` over ranks (trustlens.train.pooled) where it is a mean.
Units: log-probabilities and KL in nats, TV and probabilities in probability mass."""

from __future__ import annotations

import torch

from trustlens.divergence import topk_divergence
from trustlens.run.aggregates import LOG_RATIO_BOUND
from trustlens.train.pooled import Pooled, masked_max, masked_mean, pooled_chi2, pooled_pearson, ratio
from trustlens.train.rollout_batch import Rollout


def mismatch_metrics(batch: Rollout, old_logits: torch.Tensor, old_logp: torch.Tensor) -> dict[str, float | Pooled]:
    """How far the engine's μ is from the trainer's π_old on this batch's tokens (names and
    definitions of `trustlens.metrics`, as trustlens.analysis.mismatch computes them from the
    token rows); the means are `Pooled` over ranks, the maxima floats (a max over ranks).

    mismatch_kl: mean of log μ − log π_old (a ~ μ: the K1 estimate of KL(μ‖π_old), nats);
    k3_kl: mean of ρ − 1 − log ρ, ρ = π_old/μ (the K3 estimate, never negative);
    chi2_token: mean of ρ² − 1 (log ρ clamped to ±LOG_RATIO_BOUND before exp);
    prob_diff_mean / prob_diff_max / prob_pearson: |π_old − μ| per token, and the correlation of
    μ and π_old over the tokens;
    topk_kl_mean / topk_tv_mean / topk_tv_max: the top-K KL and TV (docs/rules.md) per token;
    log_ppl_diff / log_ppl_abs_diff: mean over responses of log PPL(π_old) − log PPL(μ), the
    per-token mean NLL gap, and of its absolute value; chi2_seq: mean over responses of
    ρ_seq² − 1, log ρ_seq = Σ log ρ over the response (clamped likewise).
    """
    m = batch.response_mask
    tv, kl = topk_divergence(old_logits, batch.mu_topk_ids, batch.mu_topk_logp)
    lengths = m.sum(-1).clamp(min=1)
    log_rho = (old_logp - batch.mu_logp).double()  # (B, T)
    nll_gap = torch.where(m, -log_rho, 0.0).sum(-1) / lengths  # (B,) padding never enters
    log_rho_seq = torch.where(m, log_rho, 0.0).sum(-1).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # (B,)
    mu, old = batch.mu_logp.double().exp(), old_logp.double().exp()  # (B, T)
    diff = (old - mu).abs()
    return {
        "mismatch_kl": masked_mean(-log_rho, m),
        "k3_kl": masked_mean(log_rho.exp() - 1 - log_rho, m),
        "chi2_token": pooled_chi2((2 * log_rho.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)).exp(), m),
        "prob_diff_mean": masked_mean(diff, m),
        "prob_diff_max": masked_max(diff, m),
        "prob_pearson": pooled_pearson(mu, old, m),
        "topk_kl_mean": masked_mean(kl, m),
        "topk_tv_mean": masked_mean(tv, m),
        "topk_tv_max": masked_max(tv, m),
        "log_ppl_diff": ratio(float(nll_gap.sum()), len(nll_gap)),
        "log_ppl_abs_diff": ratio(float(nll_gap.abs().sum()), len(nll_gap)),
        "chi2_seq": ratio(float(((2 * log_rho_seq).exp() - 1).sum()), len(nll_gap)),
    }


class BlockedCounter:
    """Per rule, how many valid tokens it blocked among those with A > 0 and with A < 0."""

    def __init__(self, rules: list[str]) -> None:
        self.rules = rules
        self.counts = torch.zeros(len(rules), 2, dtype=torch.float64)  # blocked (pos, neg)
        self.totals = torch.zeros(2, dtype=torch.float64)  # tokens (pos, neg)

    def add(self, blocked: dict[str, torch.Tensor], advantages: torch.Tensor, mask: torch.Tensor) -> None:
        pos, neg = mask & (advantages > 0), mask & (advantages < 0)
        self.totals += torch.tensor([pos.sum(), neg.sum()], dtype=torch.float64)
        for i, rule in enumerate(self.rules):
            b = blocked[rule]
            self.counts[i, 0] += (b & pos).sum()
            self.counts[i, 1] += (b & neg).sum()

    def metrics(self) -> dict[str, Pooled]:
        """blocked/<rule>/<sign>: blocked tokens / tokens of that sign, pooled over ranks."""
        return {
            f"blocked/{rule}/{side}": ratio(float(self.counts[i, j]), float(self.totals[j]))
            for i, rule in enumerate(self.rules)
            for j, side in enumerate(("pos", "neg"))
        }


__all__ = ["BlockedCounter", "mismatch_metrics"]
