"""The corrections of trustlens.rules.registry against float64 transcriptions of their papers'
formulas: the per-response decisions (GSPO, verl's rejection masks), and the gradients of GSPO,
GMPO, dual-clip PPO and the sequence-level truncated IS weight."""

import math

import polars as pl
import pytest
import torch

from trustlens.rules import RULES, Rule, evaluate, evaluate_all
from trustlens.rules.columns import evaluate_columns
from trustlens.rules.loss import policy_loss

SEQUENCE_RULES = [name for name, rule in RULES.items() if rule.level == "sequence"]


def _batch(gen, b=16, t=10, spread=0.3):
    """float64 inputs; half the responses have π within 1e-4 of π_old (inside GSPO's band)."""
    mu = torch.log_softmax(torch.randn(b, t, 6, generator=gen, dtype=torch.float64) * 2, -1)[..., 0]
    old = (mu + spread * torch.randn(b, t, generator=gen, dtype=torch.float64)).clamp(max=-1e-3)
    step = torch.where(torch.arange(b)[:, None] % 2 == 0, 1e-4, spread)
    pi = (old + step * torch.randn(b, t, generator=gen, dtype=torch.float64)).clamp(max=-1e-3)
    adv = torch.randn(b, generator=gen, dtype=torch.float64)
    adv[0] = 0.0
    lengths = torch.randint(1, t + 1, (b, 1), generator=gen)
    return dict(pi_logp=pi, mu_logp=mu, old_logp=old, advantages=adv, response_mask=torch.arange(t) < lengths)


def _expected_sequence_decision(rule, x):
    """The rule's decision per (b, t), one response at a time, in plain Python floats."""
    pi, mu, old, adv, mask = (x[k].tolist() for k in ("pi_logp", "mu_logp", "old_logp", "advantages", "response_mask"))
    out = []
    for b in range(len(pi)):
        ts = [t for t in range(len(pi[b])) if mask[b][t]]
        if rule.policy == "old":
            logs = [old[b][t] - mu[b][t] for t in ts]
        else:
            logs = [pi[b][t] - (old[b][t] if rule.anchor == "old" else mu[b][t]) for t in ts]
        log_s = sum(logs) / len(logs) if rule.statistic == "mean" else sum(logs)
        s, a = math.exp(log_s), adv[b]
        if rule.sides == "both":
            blocked = a != 0 and (s > 1 + rule.high or s < 1 - rule.low)
        else:
            blocked = (a > 0 and s > 1 + rule.high) or (a < 0 and s < 1 - rule.low)
        out.append([blocked] * len(pi[b]))
    return out


@pytest.mark.parametrize("name", SEQUENCE_RULES)
def test_sequence_rules_equal_the_formula_and_decide_whole_responses(gen, name):
    x = _batch(gen)
    got = evaluate(name, **x)
    assert got.tolist() == _expected_sequence_decision(RULES[name], x)
    assert 0 < int((got & x["response_mask"]).sum()) < int(x["response_mask"].sum())  # both decisions met
    # every token of a response shares its decision: a response blocked as a whole
    assert all(len(set(row)) == 1 for row in got.tolist())


@pytest.mark.parametrize("name", SEQUENCE_RULES)
def test_sequence_rules_on_columns_equal_the_tensors(gen, name):
    x = _batch(gen)
    mask = x["response_mask"]
    pi = x["pi_logp"]
    sums = {
        "seq_logratio_mu": torch.where(mask, pi - x["mu_logp"], 0.0).sum(1, keepdim=True).expand_as(pi),
        "seq_logratio_old": torch.where(mask, pi - x["old_logp"], 0.0).sum(1, keepdim=True).expand_as(pi),
        "seq_tokens": mask.sum(1, keepdim=True).expand_as(pi).double(),
    }
    adv = x["advantages"][:, None].expand_as(pi)
    frame = pl.DataFrame({k: v[mask].numpy() for k, v in {**sums, "pi_logp": pi, "advantage": adv}.items()})
    assert evaluate_columns([name], frame)[name].to_list() == evaluate(name, **x)[mask].tolist()


def _grad(rule, x, **kw):
    pi = x["pi_logp"].clone().requires_grad_()
    out = policy_loss(rule, **dict(x, pi_logp=pi), **kw)
    out.loss.backward()
    return out, pi.grad


def _mean_of_token_means(per_token, mask):
    per_seq = torch.where(mask, per_token, 0.0).sum(1) / mask.sum(1)
    return per_seq.mean()


def test_gspo_gradient_is_gspo_token_objective(gen):
    # GSPO-token (Zheng et al. 2025, eq. 12): s_bt = sg(s_b)·π_t/sg(π_t), s_b = exp(mean_t log π/π_old),
    # loss = mean_b mean_t max(−A s_bt, −A clip(s_bt, 1 − low, 1 + high))
    x = _batch(gen)
    rule = RULES["gspo"]
    pi = x["pi_logp"].clone().requires_grad_()
    mask, a = x["response_mask"], x["advantages"][:, None]
    log_s = (torch.where(mask, pi - x["old_logp"], 0.0).sum(1, keepdim=True) / mask.sum(1, keepdim=True)).detach()
    s = torch.exp(pi - pi.detach() + log_s)
    loss = torch.maximum(-a * s, -a * s.clamp(1 - rule.low, 1 + rule.high))
    _mean_of_token_means(loss, mask).backward()
    out, grad = _grad("gspo", x, loss_agg_mode="seq-mean-token-mean")
    assert torch.allclose(grad, pi.grad, rtol=1e-12, atol=1e-15)
    assert bool(out.blocked.any()) and bool((~out.blocked & mask & (a != 0)).any())


def test_gmpo_gradient_is_the_geometric_mean_objective(gen):
    # GMPO (Zhao et al. 2025): per response −A·exp(mean_t sgn(A)·min(sgn(A)·log r_t, sgn(A)·clip(log r_t, −ε, ε)))
    x = _batch(gen, spread=0.6)
    rule = RULES["gmpo"]
    pi = x["pi_logp"].clone().requires_grad_()
    mask, a = x["response_mask"], x["advantages"][:, None]
    log_r = pi - x["old_logp"]
    sign = torch.sign(a)
    clipped = sign * torch.minimum(sign * log_r, sign * log_r.clamp(-rule.low, rule.high))
    ratio = torch.exp(torch.where(mask, clipped, 0.0).sum(1) / mask.sum(1))
    (-(a[:, 0] * ratio)).mean().backward()
    out, grad = _grad("gmpo", x, loss_agg_mode="seq-mean-token-mean")
    assert torch.allclose(grad, pi.grad, rtol=1e-12, atol=1e-15)
    assert bool(out.blocked.any())


def test_dual_clip_gradient_is_dual_clip_ppo(gen):
    # Ye et al. 2020: A < 0 → min(max(−A r, −A clip(r)), −A c); A > 0 → max(−A r, −A clip(r))
    x = _batch(gen, spread=1.2)
    mu = x["mu_logp"]
    moved = mu + 1.2 * torch.randn(mu.shape, generator=gen, dtype=torch.float64)
    x["pi_logp"] = torch.minimum(moved, mu + math.log(9.0)).clamp(max=-1e-3)  # r < C = 10: no truncation
    pi = x["pi_logp"].clone().requires_grad_()
    mask, a = x["response_mask"], x["advantages"][:, None]
    r = torch.exp(pi - x["mu_logp"])
    clipped = torch.maximum(-a * r, -a * r.clamp(0.8, 1.2))
    loss = torch.where(a < 0, torch.minimum(clipped, -a * 3.0), clipped)
    (torch.where(mask, loss, 0.0).sum() / mask.sum()).backward()
    out, grad = _grad("dual_clip", x)
    assert torch.allclose(grad, pi.grad, rtol=1e-12, atol=1e-15)
    assert bool((out.blocked & (a < 0) & (r > 3)).any())  # the dual clip itself blocked something


def test_grpo_seq_tis_weight(gen):
    x = _batch(gen)
    out, _ = _grad("grpo_seq_tis", x)
    mask = x["response_mask"]
    log_is = torch.where(mask, x["old_logp"] - x["mu_logp"], 0.0).sum(1, keepdim=True)
    want = torch.exp(x["pi_logp"] - x["old_logp"]).clamp(max=10.0) * torch.exp(log_is).clamp(max=2.0)
    assert torch.allclose(out.weight, want, rtol=1e-12)
    assert bool((torch.exp(log_is) > 2).any()) and bool((torch.exp(log_is) < 2).any())


def test_sequence_rule_without_response_mask_names_it(gen):
    x = _batch(gen)
    x.pop("response_mask")
    with pytest.raises(ValueError, match=r"rule 'gspo' needs response_mask \(\(B, T\) which positions"):
        evaluate_all(["ppo", "gspo"], **x)


def test_sequence_rule_on_columns_without_statistics_says_what_to_record():
    frame = pl.DataFrame({"pi_logp": [-0.1], "mu_logp": [-0.2], "old_logp": [-0.2], "advantage": [1.0]})
    with pytest.raises(ValueError, match=r"'rs_geo' decides per response .*'seq_logratio_mu'.* record the run with"):
        evaluate_columns(["rs_geo"], frame)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(dual_clip=1.0), r"rule 'mine': dual_clip must be a finite number > 1, got 1.0"),
        (dict(dual_clip=3.0, measure="binary_tv"), r"rule 'mine': dual_clip applies to token rules with the 'ratio'"),
        (dict(statistic="mean", measure="binary_kl"), r"rule 'mine': a sequence rule .* measure must be 'ratio'"),
        (dict(policy="old", anchor="old"), r"rule 'mine': policy 'old' measures π_old against μ"),
        (dict(sides="one"), r"rule 'mine': sides must be one of \('push', 'both'\), got 'one'"),
        (dict(weight="seq_ratio"), r"rule 'mine': weight 'seq_ratio' needs a statistic"),
        (dict(weight="geo_mean"), r"rule 'mine': weight 'geo_mean' clips log-ratios"),
        (dict(high=1.5, measure="binary_tv"), r"rule 'mine': high must be ≤ 1 for the binary_tv measure"),
    ],
)
def test_bad_corrections(fields, message):
    base = dict(name="mine", low=0.2, high=0.2, anchor="mu", measure="ratio", description="mine")
    with pytest.raises(ValueError, match=message):
        Rule(**{**base, **fields})


def test_a_custom_rule_may_not_take_a_built_in_name(gen):
    x = _batch(gen)
    impostor = Rule("gspo", 0.1, 0.1, "mu", "binary_tv", "not GSPO")
    with pytest.raises(ValueError, match=r"rule 'gspo' is the name of a built-in rule, but this rule is defined"):
        evaluate_all([impostor], **x)
    # the built-in rule with other thresholds (and its manifest entry) is the same rule
    wider = RULES["gspo"].with_thresholds(1e-3, 1e-3)
    assert evaluate_all([wider], **x)["gspo"].shape == x["pi_logp"].shape
    assert Rule.from_manifest("gspo", wider.manifest_entry()) == wider


def test_manifest_round_trip_of_every_correction():
    for rule in RULES.values():
        assert Rule.from_manifest(rule.name, rule.manifest_entry()) == rule
    custom = Rule("geo_band", 0.01, 0.01, "mu", "ratio", "mine", statistic="mean", sides="both", policy="old")
    assert Rule.from_manifest("geo_band", custom.manifest_entry()) == custom
