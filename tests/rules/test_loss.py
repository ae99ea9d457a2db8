import math
from dataclasses import replace

import pytest
import torch

from trustlens.divergence import binary_kl, binary_tv
from trustlens.rules import RULES, evaluate
from trustlens.rules.loss import policy_loss


def _logp(*probs, dtype=torch.float64):
    return torch.log(torch.tensor([probs], dtype=dtype))


def _random_batch(gen, b=8, t=12):
    """float64 inputs: ratios π/μ in [e^-0.5, e^0.5] (< C), padding, A of both signs and 0."""
    mu = torch.log_softmax(torch.randn(b, t, 6, generator=gen, dtype=torch.float64) * 2, -1)[..., 0]
    pi = (mu + 0.5 * (2 * torch.rand(b, t, generator=gen, dtype=torch.float64) - 1)).clamp(max=-1e-3)
    old = (mu + 0.2 * torch.randn(b, t, generator=gen, dtype=torch.float64)).clamp(max=-1e-3)
    adv = torch.randn(b, generator=gen, dtype=torch.float64)
    adv[0] = 0.0
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    return dict(
        pi_logp=pi,
        mu_logp=mu,
        advantages=adv,
        response_mask=mask,
        old_logp=old,
        topk_tv=binary_tv(pi, mu) + 0.05 * torch.rand(b, t, generator=gen, dtype=torch.float64),
        topk_kl=binary_kl(pi, mu) + 0.02 * torch.rand(b, t, generator=gen, dtype=torch.float64),
    )


def _grad(rule, x, **kw):
    pi = x["pi_logp"].clone().requires_grad_()
    out = policy_loss(rule, **dict(x, pi_logp=pi), **kw)
    out.loss.backward()
    return out, pi.grad


def _textbook_ppo(pi, mu, adv, mask, low, high, agg):
    """−min(r·A, clip(r, 1 − low, 1 + high)·A), r = π/μ, aggregated as in trustlens.rules.loss."""
    r = torch.exp(pi - mu)
    a = adv[:, None].expand_as(pi)
    surrogate = -torch.minimum(r * a, torch.clamp(r, 1 - low, 1 + high) * a)
    total = (surrogate * mask).sum()
    return total / mask.sum() if agg == "token-mean" else total / mask.numel()


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("low, high", [(0.2, 0.2), (0.1, 0.28)])
def test_ppo_gradient_equals_clipped_surrogate_gradient(gen, agg, low, high):
    x = _random_batch(gen)
    out, grad = _grad("ppo", x, low=low, high=high, loss_agg_mode=agg)
    pi = x["pi_logp"].clone().requires_grad_()
    _textbook_ppo(pi, x["mu_logp"], x["advantages"], x["response_mask"], low, high, agg).backward()
    assert torch.allclose(grad, pi.grad, rtol=1e-12, atol=1e-15)
    # the data hits both the clipped and the unclipped branch of each advantage sign
    valid = x["response_mask"]
    assert 0 < float(out.blocked_frac_pos) < 1 and 0 < float(out.blocked_frac_neg) < 1
    assert bool((pi.grad[valid] == 0).any()) and bool((pi.grad[valid] != 0).any())


def test_ppo_truncates_the_weight_above_clip_ratio_c():
    # A < 0, r = π/μ = 20 > C = 10: never blocked by ppo; the gradient is −A·C (token-mean, 1
    # token) where the textbook surrogate gives −A·r = 40 and dual-clip PPO gives 0.
    x = dict(
        pi_logp=_logp(0.2),
        mu_logp=_logp(0.01),
        advantages=torch.tensor([-2.0], dtype=torch.float64),
    )
    out, grad = _grad("ppo", x, response_mask=torch.ones(1, 1))
    assert not bool(out.blocked.any())
    assert grad.item() == pytest.approx(20.0, rel=1e-12)
    assert out.weight.item() == pytest.approx(10.0, rel=1e-12)
    _, grad = _grad("ppo", x, response_mask=torch.ones(1, 1), clip_ratio_c=4.0)
    assert grad.item() == pytest.approx(8.0, rel=1e-12)


def test_default_weight_hand_checked():
    # w = min(π/μ, C) for every rule without its own weight; minirl too (its anchor is π_old, its
    # weight still π/μ)
    pi, mu, old = _logp(0.3, 1e-4, 0.8), _logp(0.5, 1e-5, 0.99), _logp(0.3, 1e-4, 0.8)
    for rule in ("ppo", "dppo_binary_tv", "pg_is", "minirl"):
        out = policy_loss(
            rule,
            pi_logp=pi,
            mu_logp=mu,
            old_logp=old,
            advantages=torch.tensor([1.0], dtype=torch.float64),
            response_mask=torch.ones(1, 3),
            clip_ratio_c=5.0,
        )
        assert out.weight[0].tolist() == pytest.approx([0.6, 5.0, 0.8 / 0.99], rel=1e-12), rule


def test_cispo_weight_hand_checked():
    # w = min(π/μ, 1 + high), no lower cap, never blocked: π/μ = 1.6, 0.8, 0.02, 20
    x = dict(
        pi_logp=_logp(0.8, 0.4, 0.01, 0.2),
        mu_logp=_logp(0.5, 0.5, 0.5, 0.01),
        advantages=torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64),
        response_mask=torch.ones(1, 4),
    )
    out, grad = _grad("cispo", x)
    assert out.weight[0].tolist() == pytest.approx([1.28, 0.8, 0.02, 1.28], rel=1e-12)
    assert not bool(out.blocked.any())
    # ∂loss/∂log π = −A·w / 4
    assert grad[0].tolist() == pytest.approx([-0.32, -0.2, 0.005, 0.32], rel=1e-12)
    out = policy_loss("cispo", high=0.5, **x)
    assert out.weight[0].tolist() == pytest.approx([1.5, 0.8, 0.02, 1.5], rel=1e-12)


def test_grpo_tis_weight_hand_checked():
    # w = min(π/π_old, C) · min(π_old/μ, 2), blocked by the PPO clip vs π_old
    x = dict(
        pi_logp=_logp(0.55, 0.55, 0.65, 0.2),
        old_logp=_logp(0.5, 0.5, 0.5, 0.01),
        mu_logp=_logp(0.2, 0.4, 0.5, 0.01),
        advantages=torch.tensor([1.0], dtype=torch.float64),
        response_mask=torch.ones(1, 4),
    )
    out, grad = _grad("grpo_tis", x, clip_ratio_c=10.0)
    # 1.1·min(2.5, 2) = 2.2;  1.1·1.25 = 1.375;  1.3·1 = 1.3 (blocked: r_old > 1.2);  min(20, 10)·1
    assert out.weight[0].tolist() == pytest.approx([2.2, 1.375, 1.3, 10.0], rel=1e-12)
    assert out.blocked[0].tolist() == [False, False, True, True]
    assert grad[0].tolist() == pytest.approx([-0.55, -0.34375, 0.0, 0.0], rel=1e-12)
    capped = policy_loss(replace(RULES["grpo_tis"], tis_cap=3.0), **x)
    assert capped.weight[0, 0].item() == pytest.approx(1.1 * 2.5, rel=1e-12)


def test_aggregation_modes_hand_checked():
    # π = μ so w = 1 and nothing is blocked: ℓ = −A·log π
    pi = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.0, -1.0]], dtype=torch.float64)
    x = dict(
        pi_logp=pi,
        mu_logp=pi.clone(),
        advantages=torch.tensor([1.0, -2.0], dtype=torch.float64),
        response_mask=torch.tensor([[1, 1, 0], [1, 0, 0]]),
    )
    # ℓ = [[1, 2, (3)], [−1, (−2), (−2)]]; masked sum 1 + 2 − 1 = 2 over 3 valid tokens
    out, grad = _grad("ppo", x)
    assert out.loss.item() == pytest.approx(2 / 3, rel=1e-12)
    assert grad.flatten().tolist() == pytest.approx([-1 / 3, -1 / 3, 0, 2 / 3, 0, 0], rel=1e-12)
    # seq-mean-token-sum-norm: (1/B) Σ_b Σ_t m·ℓ / T = 2 / (2·3)
    out, grad = _grad("ppo", x, loss_agg_mode="seq-mean-token-sum-norm")
    assert out.loss.item() == pytest.approx(1 / 3, rel=1e-12)
    assert grad.flatten().tolist() == pytest.approx([-1 / 6, -1 / 6, 0, 1 / 3, 0, 0], rel=1e-12)


def test_no_valid_token_gives_zero_loss():
    x = dict(
        pi_logp=_logp(0.5, 0.5),
        mu_logp=_logp(0.4, 0.4),
        advantages=torch.tensor([1.0], dtype=torch.float64),
    )
    out, grad = _grad("ppo", x, response_mask=torch.zeros(1, 2, dtype=torch.bool))
    assert out.loss.item() == 0.0 and grad.abs().sum().item() == 0.0
    assert math.isnan(out.blocked_frac.item())


def test_blocked_mask_and_fractions_hand_checked():
    # dppo_binary_tv (0.15): per token (A, μ → π, valid) and its decision
    #   (+1, .5 → .7, valid) blocked   (+1, .5 → .6, valid) kept   (+1, .5 → .7, padding) ignored
    #   (−1, .5 → .3, valid) blocked   (−1, .5 → .7, valid) kept   ( 0, .5 → .3, valid) kept (A = 0)
    x = dict(
        pi_logp=_logp(0.7, 0.6, 0.7, 0.3, 0.7, 0.3),
        mu_logp=_logp(*[0.5] * 6),
        advantages=torch.tensor([[1.0, 1.0, 1.0, -1.0, -1.0, 0.0]], dtype=torch.float64),
        response_mask=torch.tensor([[1, 1, 0, 1, 1, 1]]),
    )
    out = policy_loss("dppo_binary_tv", **x)
    assert out.blocked.tolist() == [[True, False, False, True, False, False]]
    assert out.blocked_frac.item() == pytest.approx(2 / 4)  # over the valid tokens with A ≠ 0
    assert out.zero_frac.item() == pytest.approx(1 / 5)
    assert out.blocked_frac_pos.item() == pytest.approx(1 / 2)
    assert out.blocked_frac_neg.item() == pytest.approx(1 / 2)
    x["advantages"] = torch.tensor([1.0], dtype=torch.float64)
    assert math.isnan(policy_loss("dppo_binary_tv", **x).blocked_frac_neg.item())


@pytest.mark.parametrize("rule", list(RULES))
def test_every_rule_blocks_as_evaluate_and_has_the_stated_gradient(gen, rule):
    x = _random_batch(gen)
    out, grad = _grad(rule, x)
    mask = x["response_mask"]
    assert torch.equal(out.blocked, evaluate(rule, **x) & mask)
    a = x["advantages"][:, None]
    kl_cov = RULES[rule].cov == "kl"  # its marked tokens keep their gradient and add the penalty
    expected = -a * out.weight * (~out.blocked | kl_cov) * mask / mask.sum()
    if kl_cov:
        expected = expected + torch.sign(x["pi_logp"] - x["old_logp"]) * out.blocked / mask.sum()
    assert torch.allclose(grad, expected, rtol=1e-12, atol=1e-15)


def test_per_sequence_equals_per_token_advantages(gen):
    x = _random_batch(gen)
    per_token = dict(x, advantages=x["advantages"][:, None].expand_as(x["pi_logp"]).clone())
    for rule in ("ppo", "dppo_binary_kl", "grpo_tis"):
        a, b = _grad(rule, x), _grad(rule, per_token)
        assert torch.equal(a[0].blocked, b[0].blocked) and torch.equal(a[1], b[1])
        assert a[0].loss.item() == b[0].loss.item()


def test_only_pi_logp_carries_gradient(gen):
    x = {k: (v.clone().requires_grad_() if v.is_floating_point() else v) for k, v in _random_batch(gen).items()}
    out = policy_loss("grpo_tis", **x)
    out.loss.backward()
    assert x["pi_logp"].grad is not None
    assert all(x[k].grad is None for k in ("mu_logp", "old_logp", "advantages", "topk_tv", "topk_kl"))
    assert not out.weight.requires_grad


def test_low_precision_pi_logp():
    pi = _logp(0.55, 0.3, dtype=torch.bfloat16).requires_grad_()
    out = policy_loss(
        "ppo",
        pi_logp=pi,
        mu_logp=_logp(0.5, 0.5, dtype=torch.float16),
        advantages=torch.tensor([1.0]),
        response_mask=torch.ones(1, 2, dtype=torch.bool),
    )
    out.loss.backward()
    assert out.loss.dtype == torch.float32 and pi.grad.dtype == torch.bfloat16
    assert pi.grad[0].tolist() == pytest.approx([-0.55, -0.3], rel=1e-2)  # −A·(π/μ)/2


def _ok(**changes):
    x = dict(
        pi_logp=torch.full((2, 3), -1.0),
        mu_logp=torch.full((2, 3), -1.2),
        advantages=torch.tensor([1.0, -1.0]),
        response_mask=torch.ones(2, 3),
    )
    x.update(changes)
    return x


@pytest.mark.parametrize(
    "rule, changes, message",
    [
        (
            "ppo",
            dict(loss_agg_mode="seq-mean"),
            r"loss_agg_mode must be one of token-mean, seq-mean-token-sum-norm, seq-mean-token-mean; got 'seq-mean'",
        ),
        ("ppo", dict(clip_ratio_c=1.0), r"clip_ratio_c must be a finite number > 1, got 1.0"),
        ("ppo", dict(clip_ratio_c=math.inf), r"clip_ratio_c must be a finite number > 1, got inf"),
        (
            "ppo",
            dict(response_mask=torch.ones(2, 4)),
            r"response_mask has shape \(2, 4\); expected \(2, 3\)",
        ),
        (
            "ppo",
            dict(response_mask=torch.full((2, 3), 0.5)),
            r"response_mask must hold only 0 and 1, got 0.5 at index \(0, 0\)",
        ),
        ("ppo", dict(response_mask=[[1, 1, 1]] * 2), r"response_mask must be a torch.Tensor"),
        (
            "ppo",
            dict(pi_logp=torch.full((6,), -1.0)),
            r"pi_logp must have shape \(B, T\), got \(6,\)",
        ),
        (
            "ppo",
            dict(mu_logp=torch.full((2, 4), -1.0)),
            r"shape mismatch: pi_logp \(2, 3\), mu_logp \(2, 4\)",
        ),
        ("ppo", dict(pi_logp=torch.full((2, 3), 0.2)), r"pi_logp holds positive"),
        ("ppo", dict(mu_logp=torch.full((2, 3), math.nan)), r"mu_logp contains NaN"),
        ("ppo", dict(advantages=torch.ones(3)), r"advantages has shape \(3,\)"),
        ("ppo", dict(high=-1.0), r"rule 'ppo': high must be a finite number ≥ 0"),
        ("grpo_tis", {}, r"rule 'grpo_tis' needs old_logp"),
        ("minirl", {}, r"rule 'minirl' needs old_logp"),
        ("dppo_topk_kl", {}, r"rule 'dppo_topk_kl' needs topk_kl"),
    ],
)
def test_bad_inputs(rule, changes, message):
    with pytest.raises(ValueError, match=message):
        policy_loss(rule, **_ok(**changes))


def test_unknown_rule():
    with pytest.raises(KeyError, match=r"unknown rule 'dppo_tv' \(did you mean 'dppo_topk_tv'\?\); known rules: ppo,"):
        policy_loss("dppo_tv", **_ok())
