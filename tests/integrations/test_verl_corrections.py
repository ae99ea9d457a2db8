"""The corrections of trustlens.rules.registry against verl 0.9's own implementations, on the same
inputs: GSPO, GMPO (geo_mean) and dual-clip PPO (vanilla) losses compared by their gradients with
respect to log π (trustlens' loss value is not the surrogate's, only its gradient is meant), the
tokens each gives no gradient, the rollout-correction rejection masks, IcePop's weights and the
sequence-level truncated IS weight.

Runs in a venv with verl ≥ 0.9 (tests/integrations/run.sh); skipped elsewhere.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from packaging.version import Version

verl = pytest.importorskip("verl")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(Version(verl.__version__) < Version("0.9"), reason="verl 0.9's loss and rollout-correction API"),
]

from trustlens.rules import RULES, evaluate  # noqa: E402
from trustlens.rules.loss import policy_loss  # noqa: E402


def _config(**fields):
    """verl's actor config with the clip ratios given (the rest as tests/integrations/verl_actor.py)."""
    from omegaconf import OmegaConf
    from verl.workers.config import FSDPActorConfig

    base = FSDPActorConfig(
        strategy="fsdp",
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=2,
        use_dynamic_bsz=False,
        ppo_epochs=1,
        rollout_n=1,
        use_kl_loss=False,
        policy_loss=OmegaConf.create({"loss_mode": "vanilla"}),
    )
    return replace(base, **fields)


def _batch(seed=0, b=16, t=12, near=1e-4, spread=0.3):
    """float64 inputs; half the responses have π within `near` of π_old, every response ≥ 1 token."""
    gen = torch.Generator().manual_seed(seed)
    mu = torch.log_softmax(torch.randn(b, t, 6, generator=gen, dtype=torch.float64) * 2, -1)[..., 0]
    old = (mu + spread * torch.randn(b, t, generator=gen, dtype=torch.float64)).clamp(max=-1e-3)
    step = torch.where(torch.arange(b)[:, None] % 2 == 0, near, spread)
    pi = (old + step * torch.randn(b, t, generator=gen, dtype=torch.float64)).clamp(max=-1e-3)
    adv = torch.randn(b, generator=gen, dtype=torch.float64)
    mask = torch.arange(t) < torch.randint(1, t + 1, (b, 1), generator=gen)
    return pi, mu, old, adv, mask


def _verl_grad(fn, old, pi, adv, mask, agg, config):
    leaf = pi.clone().requires_grad_()
    loss, _ = fn(old, leaf, adv[:, None].expand_as(pi), mask.double(), agg, config)
    loss.backward()
    return leaf.grad


def _our_grad(rule, pi, mu, old, adv, mask, agg, **kw):
    leaf = pi.clone().requires_grad_()
    out = policy_loss(
        rule, pi_logp=leaf, mu_logp=mu, old_logp=old, advantages=adv, response_mask=mask, loss_agg_mode=agg, **kw
    )
    out.loss.backward()
    return out, leaf.grad


def _same_blocked(out, verl_grad, adv, mask):
    valid = mask & (adv != 0)[:, None]
    assert torch.equal(out.blocked & valid, (verl_grad == 0) & valid)
    assert bool((out.blocked & valid).any()) and bool((~out.blocked & valid).any())


def test_gspo_equals_verls_gspo_loss():
    from verl.trainer.ppo.core_algos import compute_policy_loss_gspo

    pi, mu, old, adv, mask = _batch()
    config = _config(clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    theirs = _verl_grad(compute_policy_loss_gspo, old, pi, adv, mask, "seq-mean-token-mean", config)
    out, ours = _our_grad("gspo", pi, mu, old, adv, mask, "seq-mean-token-mean", low=3e-4, high=4e-4)
    # verl divides each response's token sum by its length + 1e-8
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-12)
    _same_blocked(out, theirs, adv, mask)


def test_gmpo_equals_verls_geo_mean_loss():
    from verl.trainer.ppo.core_algos import compute_policy_loss_geo_mean

    pi, mu, old, adv, mask = _batch(seed=1, spread=0.6)
    config = _config(clip_ratio=0.4, clip_ratio_low=0.4, clip_ratio_high=0.4)
    theirs = _verl_grad(compute_policy_loss_geo_mean, old, pi, adv, mask, "seq-mean-token-mean", config)
    out, ours = _our_grad("gmpo", pi, mu, old, adv, mask, "seq-mean-token-mean")
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-12)
    _same_blocked(out, theirs, adv, mask)


def test_dual_clip_equals_verls_vanilla_loss_against_mu():
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    pi, mu, _, adv, mask = _batch(seed=2, spread=1.0)
    pi = torch.minimum(pi, mu + 2.0)  # π/μ < e² < C = 10: trustlens' weight does not truncate
    config = _config(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
    theirs = _verl_grad(compute_policy_loss_vanilla, mu, pi, adv, mask, "token-mean", config)  # bypass: old = μ
    out, ours = _our_grad("dual_clip", pi, mu, mu, adv, mask, "token-mean")
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-15)
    _same_blocked(out, theirs, adv, mask)
    assert bool((out.blocked & (adv < 0)[:, None] & (torch.exp(pi - mu) > 3) & mask).any())  # the dual clip bit


@pytest.mark.parametrize(
    ("option", "band", "rule"),
    [
        ("token_k1", "0.5_2.0", "rs_token"),
        ("seq_sum_k1", "0.5_2.0", "rs_seq"),
        ("seq_mean_k1", "0.999_1.001", "rs_geo"),
    ],
)
def test_rejection_masks_equal_verls(option, band, rule):
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_rejection_mask

    pi, mu, old, adv, mask = _batch(seed=3, spread=0.4)
    kept, _ = compute_rollout_rejection_mask(old - mu, mask.double(), rollout_rs=option, rollout_rs_threshold=band)
    rejected = mask & (kept == 0)
    ours = evaluate(rule, pi_logp=pi, mu_logp=mu, old_logp=old, advantages=adv, response_mask=mask)
    valid = mask & (adv != 0)[:, None]
    assert torch.equal(ours & valid, rejected & valid)  # bitwise: the same comparisons on the same sums
    assert bool(rejected.any()) and bool((mask & ~rejected).any())


def test_icepop_equals_verls_rollout_is_band():
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    pi, mu, old, adv, mask = _batch(seed=4, spread=0.8)
    weights, _ = compute_rollout_correction_weights(old - mu, mask.double(), "token", "0.5_5.0")
    zeroed = mask & (weights == 0)
    ours = evaluate("icepop", pi_logp=pi, mu_logp=mu, old_logp=old, advantages=adv)
    valid = mask & (adv != 0)[:, None]
    assert torch.equal(ours & valid, zeroed & valid)
    assert bool(zeroed.any())


def test_sequence_is_weight_equals_verls():
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    pi, mu, old, adv, mask = _batch(seed=5, spread=0.2)
    weights, _ = compute_rollout_correction_weights(old - mu, mask.double(), "sequence", 2.0)
    out, _ = _our_grad("grpo_seq_tis", pi, mu, old, adv, mask, "token-mean")
    ours = out.weight / torch.exp(pi - old).clamp(max=10.0)  # the sequence factor min(Π π_old/μ, C_tis)
    torch.testing.assert_close(ours[mask], weights[mask], rtol=1e-12, atol=0)
    assert RULES["grpo_seq_tis"].tis_cap == 2.0
    assert bool((weights[mask] == 2.0).any()) and bool((weights[mask] < 2.0).any())


def _cov_config(mode, **fields):
    from omegaconf import OmegaConf

    return _config(
        clip_ratio=0.2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.2,
        policy_loss=OmegaConf.create({"loss_mode": mode, **fields}),
    )


def _cov_batch(seed):
    """A batch whose cov(log π, A) reaches past 1: log π spread over nats, A of scale 2; π/π_old < C."""
    pi, _, old, adv, mask = _batch(seed=seed, spread=0.1)
    return pi, old, old, adv * 2, mask  # μ = π_old: trustlens' weight min(π/μ, C) is verl's ratio


def test_kl_cov_equals_verls_kl_cov_loss():
    from verl.trainer.ppo.core_algos import compute_policy_loss_kl_cov

    pi, mu, old, adv, mask = _cov_batch(6)
    rule = replace(RULES["kl_cov"], cov_ratio=0.05)
    config = _cov_config("kl_cov", kl_cov_ratio=0.05, ppo_kl_coef=1.0)
    theirs = _verl_grad(compute_policy_loss_kl_cov, old, pi, adv, mask, "token-mean", config)
    out, ours = _our_grad(rule, pi, mu, old, adv, mask, "token-mean")
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-15)
    # the penalised tokens: verl's gradient there is −A·r/N + sign(log r)/N
    n = int(mask.sum())
    plain = -adv[:, None] * torch.exp(pi - old) / n
    penalised = mask & ((theirs - plain).abs() > 1e-9)
    assert torch.equal(out.blocked, penalised) and int(penalised.sum()) == max(int(0.05 * n), 1)


def test_clip_cov_candidates_and_count_equal_verls():
    from verl.trainer.ppo.core_algos import compute_policy_loss_clip_cov

    pi, mu, old, adv, mask = _cov_batch(7)
    n = int(mask.sum())
    # a wide band: more candidates than the share, so verl draws (torch's generator), trustlens too
    rule = replace(RULES["clip_cov"], cov_ratio=0.05, cov_low=0.1, cov_high=5.0)
    config = _cov_config("clip_cov", clip_cov_ratio=0.05, clip_cov_lb=0.1, clip_cov_ub=5.0)
    torch.manual_seed(0)
    theirs = _verl_grad(compute_policy_loss_clip_cov, old, pi, adv, mask, "token-mean", config)
    out, ours = _our_grad(rule, pi, mu, old, adv, mask, "token-mean", seed=(0, 0))
    clipped = evaluate("minirl", pi_logp=pi, mu_logp=mu, old_logp=old, advantages=adv) & mask
    verl_drawn = mask & (theirs == 0) & ~clipped
    ours_drawn = out.blocked & ~clipped
    k = max(int(0.05 * n), 1)
    assert int(verl_drawn.sum()) == int(ours_drawn.sum()) == k  # the same count
    # the same candidates: the unclipped tokens with 0.1 < cov < 5, centred as verl centres
    a = adv[:, None].expand_as(pi)
    cov = (a - a[mask].mean()) * (pi - pi[mask].mean())
    candidates = mask & ~clipped & (cov > 0.1) & (cov < 5.0)
    assert bool((verl_drawn <= candidates).all()) and bool((ours_drawn <= candidates).all())
    assert int(candidates.sum()) > k
    # elsewhere the gradients agree: the undrawn tokens, PPO's clip on π/π_old
    same = mask & ~verl_drawn & ~ours_drawn
    torch.testing.assert_close(ours[same], theirs[same], rtol=1e-12, atol=1e-15)


def test_clip_cov_equals_verls_loss_when_every_candidate_is_drawn():
    from verl.trainer.ppo.core_algos import compute_policy_loss_clip_cov

    pi, mu, old, adv, mask = _cov_batch(8)
    # a share of half the tokens: at most k candidates, so both take them all and no draw decides
    rule = replace(RULES["clip_cov"], cov_ratio=0.5)
    config = _cov_config("clip_cov", clip_cov_ratio=0.5, clip_cov_lb=1.0, clip_cov_ub=5.0)
    theirs = _verl_grad(compute_policy_loss_clip_cov, old, pi, adv, mask, "token-mean", config)
    out, ours = _our_grad(rule, pi, mu, old, adv, mask, "token-mean")
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-15)
    _same_blocked(out, theirs, adv, mask)
    clipped = evaluate("minirl", pi_logp=pi, mu_logp=mu, old_logp=old, advantages=adv) & mask
    assert 0 < int((out.blocked & ~clipped).sum()) < int(0.5 * int(mask.sum()))
