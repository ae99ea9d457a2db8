import math

import numpy as np
import pytest
import torch

import trustlens.rules.decision as rules_module
from trustlens.divergence import binary_kl
from trustlens.rules import RULES, Rule, evaluate, evaluate_all, resolve_rules

# (rule, A, μ, π, π_old, topk_tv, topk_kl, blocked), probabilities of the sampled token.
# "in": inside the region; "away": outside and the update the advantage asks for moves π further
# out; "back": outside but the update brings π back. A = 0 (no gradient) is never blocked.
CASES = [
    # ppo, low = high = 0.2, r = π/μ
    ("ppo", 1.0, 0.5, 0.55, None, None, None, False),  # in: r = 1.1
    ("ppo", 1.0, 0.5, 0.65, None, None, None, True),  # away: r = 1.3 > 1.2
    ("ppo", 1.0, 0.5, 0.30, None, None, None, False),  # back: r = 0.6, A > 0 raises π
    ("ppo", -1.0, 0.5, 0.45, None, None, None, False),  # in: r = 0.9
    ("ppo", -1.0, 0.5, 0.35, None, None, None, True),  # away: r = 0.7 < 0.8
    ("ppo", -1.0, 0.5, 0.70, None, None, None, False),  # back: r = 1.4, A < 0 lowers π
    ("ppo", 0.0, 0.5, 0.35, None, None, None, False),  # A = 0: never blocked, though r = 0.7
    ("ppo", 0.0, 0.5, 0.70, None, None, None, False),  # A = 0 never meets the high branch
    ("ppo", 1.0, 1e-5, 1e-4, None, None, None, True),  # paper: r = 10 on a rare token
    ("ppo", -1.0, 0.99, 0.8, None, None, None, False),  # paper: r = 0.808 > 0.8
    # ppo_clip_higher, low 0.2, high 0.28
    ("ppo_clip_higher", 1.0, 0.5, 0.62, None, None, None, False),  # in: r = 1.24 (ppo blocks)
    ("ppo_clip_higher", 1.0, 0.5, 0.66, None, None, None, True),  # away: r = 1.32 > 1.28
    ("ppo_clip_higher", 1.0, 0.5, 0.30, None, None, None, False),  # back
    ("ppo_clip_higher", -1.0, 0.5, 0.45, None, None, None, False),  # in: r = 0.9
    ("ppo_clip_higher", -1.0, 0.5, 0.35, None, None, None, True),  # away: r = 0.7
    ("ppo_clip_higher", -1.0, 0.5, 0.70, None, None, None, False),  # back
    ("ppo_clip_higher", 0.0, 0.5, 0.35, None, None, None, False),  # A = 0: never blocked, r = 0.7
    # minirl: r = π/π_old; μ chosen so that the decision vs μ would be the opposite
    ("minirl", 1.0, 0.60, 0.55, 0.5, None, None, False),  # in: r_old = 1.1 (π/μ irrelevant)
    ("minirl", 1.0, 0.60, 0.65, 0.5, None, None, True),  # away: r_old = 1.3 (π/μ = 1.08)
    ("minirl", 1.0, 0.60, 0.30, 0.5, None, None, False),  # back: r_old = 0.6
    ("minirl", -1.0, 0.30, 0.45, 0.5, None, None, False),  # in: r_old = 0.9
    ("minirl", -1.0, 0.40, 0.35, 0.5, None, None, True),  # away: r_old = 0.7 (π/μ = 0.875)
    ("minirl", -1.0, 0.30, 0.70, 0.5, None, None, False),  # back
    ("minirl", 0.0, 0.40, 0.35, 0.5, None, None, False),  # A = 0: never blocked, r_old = 0.7
    # dppo_binary_tv, bound 0.15 on π − μ
    ("dppo_binary_tv", 1.0, 0.5, 0.60, None, None, None, False),  # in: +0.10
    ("dppo_binary_tv", 1.0, 0.5, 0.70, None, None, None, True),  # away: +0.20
    ("dppo_binary_tv", 1.0, 0.5, 0.30, None, None, None, False),  # back: −0.20
    ("dppo_binary_tv", -1.0, 0.5, 0.40, None, None, None, False),  # in: −0.10
    ("dppo_binary_tv", -1.0, 0.5, 0.30, None, None, None, True),  # away: −0.20
    ("dppo_binary_tv", -1.0, 0.5, 0.70, None, None, None, False),  # back: +0.20
    ("dppo_binary_tv", 0.0, 0.5, 0.30, None, None, None, False),  # A = 0: never blocked, −0.20
    ("dppo_binary_tv", 0.0, 0.5, 0.70, None, None, None, False),  # A = 0, +0.20
    ("dppo_binary_tv", 1.0, 1e-5, 1e-4, None, None, None, False),  # paper: moved 9e-5 of mass
    ("dppo_binary_tv", -1.0, 0.99, 0.8, None, None, None, True),  # paper: moved 0.19
    # dppo_binary_kl, bound 0.05; KL(0.5 ‖ 0.6) = KL(0.5 ‖ 0.4) = 0.0204,
    # KL(0.5 ‖ 0.7) = KL(0.5 ‖ 0.3) = 0.0872 (hand: ½ln(5/7) + ½ln(5/3))
    ("dppo_binary_kl", 1.0, 0.5, 0.60, None, None, None, False),  # in
    ("dppo_binary_kl", 1.0, 0.5, 0.70, None, None, None, True),  # away
    ("dppo_binary_kl", 1.0, 0.5, 0.30, None, None, None, False),  # back
    ("dppo_binary_kl", -1.0, 0.5, 0.40, None, None, None, False),  # in
    ("dppo_binary_kl", -1.0, 0.5, 0.30, None, None, None, True),  # away
    ("dppo_binary_kl", -1.0, 0.5, 0.70, None, None, None, False),  # back
    ("dppo_binary_kl", 0.0, 0.5, 0.30, None, None, None, False),  # A = 0: never blocked
    ("dppo_binary_kl", 1.0, 1e-5, 1e-4, None, None, None, False),  # KL = 6.7e-5
    ("dppo_binary_kl", -1.0, 0.99, 0.8, None, None, None, True),  # KL = 0.1810
    # dppo_topk_tv, bound 0.15 on the given top-K TV; direction from π vs μ of a_t
    ("dppo_topk_tv", 1.0, 0.5, 0.52, None, 0.10, None, False),  # in
    ("dppo_topk_tv", 1.0, 0.5, 0.52, None, 0.20, None, True),  # away: other ids moved too
    ("dppo_topk_tv", 1.0, 0.5, 0.48, None, 0.20, None, False),  # back
    ("dppo_topk_tv", -1.0, 0.5, 0.48, None, 0.10, None, False),  # in
    ("dppo_topk_tv", -1.0, 0.5, 0.48, None, 0.20, None, True),  # away
    ("dppo_topk_tv", -1.0, 0.5, 0.52, None, 0.20, None, False),  # back
    ("dppo_topk_tv", 0.0, 0.5, 0.48, None, 0.20, None, False),  # A = 0: never blocked
    ("dppo_topk_tv", 1.0, 0.5, 0.70, None, 0.10, None, False),  # binary TV 0.2 is not its measure
    # dppo_topk_kl, bound 0.05
    ("dppo_topk_kl", 1.0, 0.5, 0.52, None, None, 0.01, False),  # in
    ("dppo_topk_kl", 1.0, 0.5, 0.52, None, None, 0.08, True),  # away
    ("dppo_topk_kl", 1.0, 0.5, 0.48, None, None, 0.08, False),  # back
    ("dppo_topk_kl", -1.0, 0.5, 0.48, None, None, 0.01, False),  # in
    ("dppo_topk_kl", -1.0, 0.5, 0.48, None, None, 0.08, True),  # away
    ("dppo_topk_kl", -1.0, 0.5, 0.52, None, None, 0.08, False),  # back
    ("dppo_topk_kl", 0.0, 0.5, 0.48, None, None, 0.08, False),  # A = 0: never blocked
    # recompute variants: anchor π_old; μ set so the decision vs μ would be the opposite
    ("dppo_binary_tv_recompute", 1.0, 0.65, 0.70, 0.5, None, None, True),  # away: +0.2 vs π_old
    ("dppo_binary_tv_recompute", 1.0, 0.30, 0.55, 0.5, None, None, False),  # in: +0.05 vs π_old
    ("dppo_binary_tv_recompute", 1.0, 0.70, 0.30, 0.5, None, None, False),  # back
    ("dppo_binary_tv_recompute", -1.0, 0.35, 0.30, 0.5, None, None, True),  # away: −0.2
    ("dppo_binary_tv_recompute", -1.0, 0.70, 0.45, 0.5, None, None, False),  # in: −0.05
    ("dppo_binary_tv_recompute", -1.0, 0.30, 0.70, 0.5, None, None, False),  # back
    ("dppo_binary_tv_recompute", 0.0, 0.35, 0.30, 0.5, None, None, False),  # A = 0: never blocked
    ("dppo_binary_kl_recompute", 1.0, 0.65, 0.70, 0.5, None, None, True),  # away: KL 0.087
    ("dppo_binary_kl_recompute", 1.0, 0.30, 0.60, 0.5, None, None, False),  # in: KL 0.020
    ("dppo_binary_kl_recompute", 1.0, 0.70, 0.30, 0.5, None, None, False),  # back
    ("dppo_binary_kl_recompute", -1.0, 0.35, 0.30, 0.5, None, None, True),  # away
    ("dppo_binary_kl_recompute", -1.0, 0.70, 0.40, 0.5, None, None, False),  # in
    ("dppo_binary_kl_recompute", -1.0, 0.30, 0.70, 0.5, None, None, False),  # back
    ("dppo_binary_kl_recompute", 0.0, 0.35, 0.30, 0.5, None, None, False),  # A = 0: never blocked
    # grpo_tis blocks as PPO vs π_old
    ("grpo_tis", 1.0, 0.60, 0.65, 0.5, None, None, True),  # away: r_old = 1.3
    ("grpo_tis", 1.0, 0.20, 0.55, 0.5, None, None, False),  # in: r_old = 1.1
    ("grpo_tis", 1.0, 0.20, 0.30, 0.5, None, None, False),  # back
    ("grpo_tis", -1.0, 0.40, 0.35, 0.5, None, None, True),  # away: r_old = 0.7
    ("grpo_tis", -1.0, 0.40, 0.70, 0.5, None, None, False),  # back
    ("grpo_tis", 0.0, 0.40, 0.35, 0.5, None, None, False),  # A = 0: never blocked
    # cispo and pg_is never block, however far π has moved
    *[
        (r, a, 0.5, p, None, None, None, False)
        for r in ("cispo", "pg_is")
        for a in (1.0, -1.0, 0.0)
        for p in (0.05, 0.99)
    ],
    ("cispo", 1.0, 1e-5, 1e-4, None, None, None, False),
    ("pg_is", -1.0, 0.99, 0.8, None, None, None, False),
    # icepop: π_old/μ outside [0.5, 5] on either side, whatever π does; A = 0 never blocked
    ("icepop", 1.0, 0.5, 0.9, 0.2, None, None, True),  # π_old/μ = 0.4, A > 0 (π/μ = 1.8 irrelevant)
    ("icepop", -1.0, 0.5, 0.1, 0.2, None, None, True),  # 0.4, A < 0
    ("icepop", 1.0, 0.1, 0.9, 0.6, None, None, True),  # 6 > 5
    ("icepop", -1.0, 0.1, 0.05, 0.6, None, None, True),  # 6: both sides are rejected
    ("icepop", 1.0, 0.5, 0.9, 0.3, None, None, False),  # 0.6: inside
    ("icepop", 0.0, 0.5, 0.9, 0.2, None, None, False),  # A = 0
    # dual_clip: ppo's clip, and A < 0 with π/μ > 3
    ("dual_clip", -1.0, 0.1, 0.35, None, None, None, True),  # r = 3.5 > c: ppo's "back", blocked
    ("dual_clip", -1.0, 0.1, 0.25, None, None, None, False),  # r = 2.5 < c: back
    ("dual_clip", 1.0, 0.1, 0.35, None, None, None, True),  # r = 3.5 > 1.2, away
    ("dual_clip", -1.0, 0.5, 0.35, None, None, None, True),  # r = 0.7, away
    ("dual_clip", 1.0, 0.5, 0.55, None, None, None, False),  # in
    ("dual_clip", 0.0, 0.1, 0.35, None, None, None, False),  # A = 0
    # gspo on a one-token response: s = π/π_old, band [1 − 3e-4, 1 + 4e-4]
    ("gspo", 1.0, 0.3, 0.5001, 0.5, None, None, False),  # s = 1.0002
    ("gspo", 1.0, 0.3, 0.5003, 0.5, None, None, True),  # s = 1.0006
    ("gspo", 1.0, 0.3, 0.4990, 0.5, None, None, False),  # back
    ("gspo", -1.0, 0.3, 0.4999, 0.5, None, None, False),  # s = 0.9998
    ("gspo", -1.0, 0.3, 0.4998, 0.5, None, None, True),  # s = 0.9996 < 0.9997
    ("gspo", -1.0, 0.3, 0.5010, 0.5, None, None, False),  # back
    ("gspo", 0.0, 0.3, 0.4, 0.5, None, None, False),  # A = 0
    # gmpo: |log(π/π_old)| against 0.4
    ("gmpo", 1.0, 0.3, 0.7, 0.4, None, None, True),  # log 1.75 = 0.56
    ("gmpo", 1.0, 0.3, 0.55, 0.4, None, None, False),  # log 1.375 = 0.32
    ("gmpo", -1.0, 0.3, 0.25, 0.4, None, None, True),  # log 0.625 = −0.47
    ("gmpo", -1.0, 0.3, 0.3, 0.4, None, None, False),  # −0.29
    ("gmpo", -1.0, 0.3, 0.7, 0.4, None, None, False),  # back
    ("gmpo", 0.0, 0.3, 0.7, 0.4, None, None, False),  # A = 0
    # verl's rejection masks on π_old/μ, [0.5, 2] (token, product), [0.999, 1.001] (geometric mean)
    ("rs_token", 1.0, 0.2, 0.9, 0.5, None, None, True),  # 2.5
    ("rs_token", -1.0, 0.2, 0.1, 0.5, None, None, True),  # 2.5, either side
    ("rs_token", 1.0, 0.5, 0.9, 0.2, None, None, True),  # 0.4
    ("rs_token", 1.0, 0.5, 0.9, 0.3, None, None, False),  # 0.6
    ("rs_token", 0.0, 0.2, 0.9, 0.5, None, None, False),  # A = 0
    ("rs_seq", -1.0, 0.2, 0.1, 0.5, None, None, True),  # one token: the product is 2.5
    ("rs_seq", 1.0, 0.5, 0.9, 0.3, None, None, False),  # 0.6
    ("rs_geo", 1.0, 0.5, 0.9, 0.5006, None, None, True),  # 1.0012
    ("rs_geo", -1.0, 0.5, 0.1, 0.5004, None, None, False),  # 1.0008
    ("rs_geo", -1.0, 0.5, 0.1, 0.4990, None, None, True),  # 0.998
    # grpo_seq_tis blocks as PPO vs π_old
    ("grpo_seq_tis", 1.0, 0.60, 0.65, 0.5, None, None, True),  # away: r_old = 1.3
    ("grpo_seq_tis", 1.0, 0.20, 0.55, 0.5, None, None, False),  # in
    ("grpo_seq_tis", -1.0, 0.40, 0.35, 0.5, None, None, True),  # away: r_old = 0.7
    ("grpo_seq_tis", 0.0, 0.40, 0.35, 0.5, None, None, False),  # A = 0
    # batch rules on a one-token batch: cov = 0 (centred), so Clip-Cov selects nothing beyond its
    # PPO clip vs π_old, and KL-Cov's top share k = max(⌊2e-4·1⌋, 1) = 1 is the token itself
    ("clip_cov", 1.0, 0.60, 0.65, 0.5, None, None, True),  # away: r_old = 1.3
    ("clip_cov", 1.0, 0.20, 0.55, 0.5, None, None, False),  # in: cov = 0 is outside (1, 5)
    ("clip_cov", 0.0, 0.40, 0.35, 0.5, None, None, False),  # A = 0
    ("kl_cov", 1.0, 0.5, 0.55, 0.5, None, None, True),  # penalised: the top token by cov
    ("kl_cov", -1.0, 0.5, 0.45, 0.5, None, None, True),
    ("kl_cov", 0.0, 0.5, 0.55, 0.5, None, None, False),  # A = 0: never penalised
]


def _logp(p):
    return None if p is None else torch.tensor([[math.log(p)]], dtype=torch.float64)


def _case_id(case):
    rule, a, mu, pi, old, *_ = case
    return f"{rule}-A{a:+g}-mu{mu:g}-pi{pi:g}" + ("" if old is None else f"-old{old:g}")


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_rule_decisions_hand_checked(case):
    rule, a, mu, pi, old, tv, kl, expected = case
    out = evaluate(
        rule,
        pi_logp=_logp(pi),
        mu_logp=_logp(mu),
        advantages=torch.tensor([a]),
        old_logp=_logp(old),
        topk_tv=None if tv is None else torch.tensor([[tv]]),
        topk_kl=None if kl is None else torch.tensor([[kl]]),
        response_mask=torch.ones(1, 1, dtype=torch.bool),  # a one-token response
    )
    assert out.dtype == torch.bool and out.shape == (1, 1)
    assert bool(out) is expected


def test_every_rule_has_cases():
    assert {c[0] for c in CASES} == set(RULES)


def test_paper_examples():
    # μ = 1e-5 → π = 1e-4 with A > 0 (a rare token made 10× likelier: 9e-5 of mass moved), and
    # μ = 0.99 → π = 0.8 with A < 0 (0.19 of mass moved, ratio 0.81)
    out = evaluate_all(
        ["ppo", "dppo_binary_tv"],
        pi_logp=torch.log(torch.tensor([1e-4, 0.8])),
        mu_logp=torch.log(torch.tensor([1e-5, 0.99])),
        advantages=torch.tensor([1.0, -1.0]),
    )
    assert out["ppo"].tolist() == [True, False]
    assert out["dppo_binary_tv"].tolist() == [False, True]


def test_shared_quantities_computed_once(monkeypatch, rule_inputs):
    calls = []
    distance = rules_module._distance
    monkeypatch.setattr(
        rules_module, "_distance", lambda measure, *args: calls.append(measure) or distance(measure, *args)
    )
    tight_kl = Rule("tight_kl", 0.01, 0.01, "mu", "binary_kl", "binary KL with a 0.01 bound")
    out = evaluate_all(
        ["ppo", "ppo_clip_higher", "dppo_binary_kl", tight_kl, "minirl", "grpo_tis", "cispo"],
        **rule_inputs(),
    )
    assert len(out) == 7
    # ratio vs μ once, binary KL vs μ once, ratio vs π_old once
    assert sorted(calls) == ["binary_kl", "ratio", "ratio"]


def test_hand_checked_binary_kl_values():
    # the KL(μ ‖ π) values quoted in CASES, in float64
    pi = torch.log(torch.tensor([0.7, 0.6, 1e-4, 0.8], dtype=torch.float64))
    mu = torch.log(torch.tensor([0.5, 0.5, 1e-5, 0.99], dtype=torch.float64))
    kl = binary_kl(pi, mu).tolist()
    assert kl[0] == pytest.approx(0.5 * math.log(5 / 7) + 0.5 * math.log(5 / 3), rel=1e-12)
    assert kl[0] == pytest.approx(0.0872, abs=1e-4)
    assert kl[1] == pytest.approx(0.0204, abs=1e-4)
    assert kl[2] == pytest.approx(6.7e-5, rel=1e-2)
    assert kl[3] == pytest.approx(0.99 * math.log(0.99 / 0.8) + 0.01 * math.log(0.01 / 0.2), rel=1e-12)
    assert kl[3] == pytest.approx(0.1810, abs=1e-4)


def test_registry_entries():
    for name, rule in RULES.items():
        assert rule.name == name and rule.description and rule.anchor in ("mu", "old")
    assert (RULES["ppo"].low, RULES["ppo"].high) == (0.2, 0.2)
    assert (RULES["ppo_clip_higher"].low, RULES["ppo_clip_higher"].high) == (0.2, 0.28)
    assert (RULES["dppo_binary_tv"].low, RULES["dppo_binary_kl"].high) == (0.15, 0.05)
    assert (RULES["cispo"].low, RULES["cispo"].high, RULES["cispo"].blocks) == (None, 0.28, False)
    assert (RULES["pg_is"].low, RULES["pg_is"].high, RULES["pg_is"].blocks) == (None, None, False)
    assert RULES["grpo_tis"].tis_cap == 2.0
    assert (RULES["icepop"].low, RULES["icepop"].high) == (0.5, 4.0)  # [α, β] = [0.5, 5]
    assert (RULES["gspo"].low, RULES["gspo"].high, RULES["gspo"].level) == (3e-4, 4e-4, "sequence")
    assert (RULES["rs_seq"].low, RULES["rs_seq"].high, RULES["rs_geo"].high) == (0.5, 1.0, 1e-3)
    assert RULES["dual_clip"].dual_clip == 3.0 and RULES["gmpo"].measure == "log_ratio"
    needs = {name: rule.needs for name, rule in RULES.items() if rule.needs}
    old, seq = ("old_logp",), ("old_logp", "response_mask")
    assert needs == {
        "minirl": old,
        "dppo_binary_tv_recompute": old,
        "dppo_binary_kl_recompute": old,
        "grpo_tis": old,
        "dppo_topk_tv": ("topk_tv",),
        "dppo_topk_kl": ("topk_kl",),
        "icepop": old,
        "gspo": seq,
        "gmpo": seq,
        "rs_token": old,
        "rs_seq": seq,
        "rs_geo": seq,
        "grpo_seq_tis": seq,
        "clip_cov": seq,
        "kl_cov": seq,
    }
    assert {n for n, r in RULES.items() if r.anchor == "old"} == {
        "minirl",
        "dppo_binary_tv_recompute",
        "dppo_binary_kl_recompute",
        "grpo_tis",
        "gspo",
        "gmpo",
        "grpo_seq_tis",
        "clip_cov",
        "kl_cov",
    }
    assert {n for n, r in RULES.items() if r.level == "sequence"} == {"gspo", "rs_seq", "rs_geo"}
    assert {n for n, r in RULES.items() if r.level == "batch"} == {"clip_cov", "kl_cov"}
    assert (RULES["clip_cov"].cov_ratio, RULES["clip_cov"].cov_low, RULES["clip_cov"].cov_high) == (2e-4, 1.0, 5.0)
    assert (RULES["kl_cov"].cov_ratio, RULES["kl_cov"].kl_coef, RULES["kl_cov"].blocks) == (2e-4, 1.0, True)


def test_evaluate_all_equals_evaluate(rule_inputs):
    x = rule_inputs(b=24)  # responses enough that each sequence rule meets both of its decisions
    every = evaluate_all(list(RULES), **x)
    assert list(every) == list(RULES)
    for name, mask in every.items():
        assert torch.equal(mask, evaluate(name, **x)), name
        # the random data exercises both decisions of every rule that blocks at all
        assert 0 < float(mask.double().mean()) < 1 if RULES[name].blocks else not bool(mask.any())
    custom = evaluate_all({"ppo": (0.1, None), "dppo_binary_tv": (None, 0.05)}, **x)
    assert torch.equal(custom["ppo"], evaluate("ppo", low=0.1, **x))
    assert torch.equal(custom["dppo_binary_tv"], evaluate("dppo_binary_tv", high=0.05, **x))
    as_rules = evaluate_all([RULES["ppo"].with_thresholds(high=0.28), "minirl"], **x)
    assert torch.equal(as_rules["ppo"], every["ppo_clip_higher"])
    assert torch.equal(as_rules["minirl"], every["minirl"])


def test_per_sequence_equals_per_token_advantages(rule_inputs):
    x = rule_inputs()
    per_token = dict(x, advantages=x["advantages"][:, None].expand_as(x["pi_logp"]).clone())
    a, b = evaluate_all(list(RULES), **x), evaluate_all(list(RULES), **per_token)
    assert all(torch.equal(a[k], b[k]) for k in RULES)


def test_per_token_advantages_switch_branch_within_a_sequence():
    # one sequence, same move (π 0.5 → 0.65, r = 1.3) under A = +1 and A = −1
    pi, mu = torch.log(torch.tensor([[0.65, 0.65]])), torch.log(torch.tensor([[0.5, 0.5]]))
    out = evaluate("ppo", pi_logp=pi, mu_logp=mu, advantages=torch.tensor([[1.0, -1.0]]))
    assert out.tolist() == [[True, False]]


def test_ppo_and_dppo_tv_match_their_closed_forms(rule_inputs):
    x = rule_inputs()
    a = x["advantages"][:, None].expand_as(x["pi_logp"])
    assert bool((a == 0).any()) and bool((a > 0).any()) and bool((a < 0).any())
    r = torch.exp(x["pi_logp"] - x["mu_logp"])
    expected = ((a > 0) & (r > 1.2)) | ((a < 0) & (r < 0.8))
    assert torch.equal(evaluate("ppo", **x), expected)
    diff = torch.exp(x["pi_logp"]) - torch.exp(x["mu_logp"])
    assert torch.equal(evaluate("dppo_binary_tv", **x), ((a > 0) & (diff > 0.15)) | ((a < 0) & (diff < -0.15)))


def test_threshold_overrides():
    pi, mu, a = torch.log(torch.tensor([0.65])), torch.log(torch.tensor([0.5])), torch.tensor([1.0])
    assert bool(evaluate("ppo", pi_logp=pi, mu_logp=mu, advantages=a))
    assert not bool(evaluate("ppo", pi_logp=pi, mu_logp=mu, advantages=a, high=0.5))
    assert bool(evaluate("ppo", pi_logp=pi, mu_logp=mu, advantages=a, low=0.9))  # low: other branch
    assert not bool(evaluate("cispo", pi_logp=pi, mu_logp=mu, advantages=a, high=0.5))
    assert not bool(evaluate("ppo", pi_logp=pi, mu_logp=mu, advantages=a, high=np.float32(0.5)))


def test_low_precision_inputs():
    pi = torch.log(torch.tensor([[0.65, 0.3]])).to(torch.bfloat16)
    mu = torch.log(torch.tensor([[0.5, 0.5]])).to(torch.float16)
    out = evaluate("dppo_binary_tv", pi_logp=pi, mu_logp=mu, advantages=torch.tensor([-1.0]))
    assert out.tolist() == [[False, True]]


def test_unknown_rule_lists_known_rules():
    x = dict(pi_logp=torch.tensor([-1.0]), mu_logp=torch.tensor([-1.0]), advantages=torch.tensor([1.0]))
    known = r"unknown rule 'dppo' \(did you mean 'ppo'\?\); known rules: ppo, ppo_clip_higher.*grpo_tis"
    with pytest.raises(KeyError, match=known):
        evaluate("dppo", **x)
    with pytest.raises(KeyError, match="unknown rule 'nope'"):
        evaluate_all(["ppo", "nope"], **x)


@pytest.mark.parametrize(
    "rule, arg",
    [
        ("minirl", "old_logp"),
        ("dppo_binary_tv_recompute", "old_logp"),
        ("dppo_binary_kl_recompute", "old_logp"),
        ("grpo_tis", "old_logp"),
        ("dppo_topk_tv", "topk_tv"),
        ("dppo_topk_kl", "topk_kl"),
    ],
)
def test_missing_input_names_rule_and_argument(rule, arg):
    x = dict(pi_logp=torch.tensor([-1.0]), mu_logp=torch.tensor([-1.0]), advantages=torch.tensor([1.0]))
    with pytest.raises(ValueError, match=rf"rule '{rule}' needs {arg}"):
        evaluate(rule, **x)
    with pytest.raises(ValueError, match=rf"rule '{rule}' needs {arg}"):
        evaluate_all(["ppo", rule], **x)


def _bad(**changes):
    x = dict(
        pi_logp=torch.full((2, 3), -1.0),
        mu_logp=torch.full((2, 3), -1.2),
        advantages=torch.tensor([1.0, -1.0]),
        old_logp=torch.full((2, 3), -1.1),
        topk_tv=torch.full((2, 3), 0.1),
        topk_kl=torch.full((2, 3), 0.01),
    )
    x.update(changes)
    return x


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            dict(mu_logp=torch.full((2, 4), -1.0)),
            r"shape mismatch: pi_logp \(2, 3\), mu_logp \(2, 4\)",
        ),
        (dict(old_logp=torch.full((3, 2), -1.0)), r"shape mismatch: .*old_logp \(3, 2\)"),
        (dict(topk_kl=torch.zeros(2)), r"shape mismatch: .*topk_kl \(2,\)"),
        (dict(advantages=torch.zeros(3)), r"advantages has shape \(3,\)"),
        (dict(advantages=torch.tensor([1.0, math.nan])), r"advantages contains NaN"),
        (
            dict(mu_logp=torch.tensor([[-1.0, math.nan, -1.0]] * 2)),
            r"mu_logp contains NaN.*\(0, 1\)",
        ),
        (
            dict(pi_logp=torch.tensor([[-1.0, -1.0, math.inf]] * 2)),
            r"pi_logp contains inf.*\(0, 2\)",
        ),
        (
            dict(old_logp=torch.tensor([[-1.0, -1.0, 0.3]] * 2)),
            r"old_logp holds positive.*\(0, 2\)",
        ),
        (dict(pi_logp=torch.full((2, 3), 0.5)), r"pi_logp holds positive.*\(0, 0\)"),
        (dict(topk_tv=torch.tensor([[0.1, -0.2, 0.1]] * 2)), r"topk_tv holds negative.*\(0, 1\)"),
        (dict(topk_kl=torch.tensor([[0.1, 0.1, -math.inf]] * 2)), r"topk_kl contains -inf.*\(0, 2\)"),
        (dict(topk_tv=torch.tensor([[0.1, 0.1, math.inf]] * 2)), r"topk_tv contains inf.*\(0, 2\)"),
        (dict(advantages=torch.tensor([1, -1])), r"advantages must be a floating-point tensor"),
        (dict(pi_logp=[-1.0, -1.0]), r"pi_logp must be a torch.Tensor"),
    ],
)
def test_bad_inputs(changes, message):
    with pytest.raises(ValueError, match=message):
        evaluate("ppo", **_bad(**changes))
    with pytest.raises(ValueError, match=message):
        evaluate_all(list(RULES), **_bad(**changes))


def test_bad_thresholds():
    x = _bad()
    with pytest.raises(ValueError, match=r"rule 'ppo': high must be a finite number ≥ 0, got -0.1"):
        evaluate("ppo", high=-0.1, **x)
    with pytest.raises(ValueError, match=r"rule 'ppo': low must be a finite number ≥ 0, got nan"):
        evaluate("ppo", low=math.nan, **x)
    with pytest.raises(ValueError, match=r"rule 'cispo' has no low threshold; got low=0.1"):
        evaluate("cispo", low=0.1, **x)
    with pytest.raises(ValueError, match=r"rule 'pg_is' has no high threshold"):
        evaluate_all({"pg_is": (None, 0.2)}, **x)


def test_bad_rule_lists():
    x = _bad()
    with pytest.raises(ValueError, match=r"rules must be a list of rule names, got the string 'ppo'"):
        evaluate_all("ppo", **x)
    with pytest.raises(ValueError, match=r"rules lists ppo more than once"):
        evaluate_all(["ppo", RULES["ppo"].with_thresholds(high=0.3)], **x)
    with pytest.raises(ValueError, match=r"rules\['ppo'\] must be a \(low, high\) pair, got 0.2"):
        evaluate_all({"ppo": 0.2}, **x)
    with pytest.raises(KeyError, match="unknown rule 3"):
        resolve_rules([3])


def test_custom_rule_object():
    loose = Rule("loose_tv", 0.5, 0.5, "mu", "binary_tv", "binary TV with a 0.5 bound")
    x = dict(
        pi_logp=torch.log(torch.tensor([0.9])),
        mu_logp=torch.log(torch.tensor([0.5])),
        advantages=torch.tensor([1.0]),
    )
    out = evaluate_all([loose, "dppo_binary_tv"], **x)
    assert out["loose_tv"].tolist() == [False] and out["dppo_binary_tv"].tolist() == [True]


def test_zero_advantage_is_never_blocked(gen, rule_inputs):
    # π far from every anchor in both directions, divergences beyond every threshold
    x = rule_inputs()
    x["pi_logp"] = torch.where(torch.rand(x["pi_logp"].shape, generator=gen) < 0.5, -1e-3, -8.0).double()
    x["topk_tv"], x["topk_kl"] = torch.ones_like(x["pi_logp"]), torch.full_like(x["pi_logp"], math.inf)
    x["advantages"] = torch.zeros_like(x["advantages"])
    for name, mask in evaluate_all(list(RULES), **x).items():
        assert not bool(mask.any()), name
    # and the same inputs with A ≠ 0 are blocked by every blocking rule somewhere
    x["advantages"] = torch.tensor([1.0, -1.0] * 3, dtype=torch.float64)
    assert all(bool(m.any()) for n, m in evaluate_all(list(RULES), **x).items() if RULES[n].blocks)


@pytest.mark.parametrize(
    "rule, a, pi, mu, topk_kl, expected",
    [
        # binary KL = +inf (π(a_t) = 0 < μ): beyond every threshold when A < 0 pushes π down
        ("dppo_binary_kl", -1.0, 0.0, 0.5, None, True),
        ("dppo_binary_kl", 1.0, 0.0, 0.5, None, False),  # A > 0 raises π: back into the region
        ("dppo_binary_kl", 0.0, 0.0, 0.5, None, False),  # A = 0
        # top-K KL = +inf, direction from π vs μ of a_t
        ("dppo_topk_kl", 1.0, 0.6, 0.5, math.inf, True),
        ("dppo_topk_kl", 1.0, 0.4, 0.5, math.inf, False),
        ("dppo_topk_kl", -1.0, 0.4, 0.5, math.inf, True),
        ("dppo_topk_kl", -1.0, 0.6, 0.5, math.inf, False),
        ("dppo_topk_kl", 0.0, 0.4, 0.5, math.inf, False),
        # the ratio and TV rules take π(a_t) = 0 as ratio 0 and TV μ
        ("ppo", -1.0, 0.0, 0.5, None, True),
        ("dppo_binary_tv", -1.0, 0.0, 0.5, None, True),
        ("dppo_binary_tv", -1.0, 0.0, 0.1, None, False),  # |0 − 0.1| ≤ 0.15
    ],
)
def test_infinite_divergences_are_beyond_every_threshold(rule, a, pi, mu, topk_kl, expected):
    x = dict(
        pi_logp=torch.tensor([math.log(pi) if pi > 0 else -math.inf]),
        mu_logp=torch.tensor([math.log(mu)]),
        advantages=torch.tensor([a]),
        topk_kl=None if topk_kl is None else torch.tensor([topk_kl]),
    )
    assert evaluate(rule, **x).tolist() == [expected]
    # an infinite KL stays beyond the largest finite threshold; finite distances do not (a TV
    # threshold is at most 1, the largest TV)
    big = 1.0 if rule.endswith("_tv") else 1e30
    assert evaluate(rule, **x, low=big, high=big).tolist() == [expected and rule.endswith("_kl")]


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(low=math.nan), r"rule 'mine': low must be a finite number ≥ 0, got nan"),
        (dict(high=-0.1), r"rule 'mine': high must be a finite number ≥ 0, got -0.1"),
        (dict(high=math.inf), r"rule 'mine': high must be a finite number ≥ 0, got inf"),
        (dict(low="0.2"), r"rule 'mine': low must be a finite number ≥ 0, got '0.2'"),
        (dict(low=None), r"rule 'mine': low is required"),
        (dict(anchor="pi"), r"rule 'mine': anchor must be one of \('mu', 'old'\), got 'pi'"),
        (dict(measure="l2"), r"rule 'mine': measure must be one of"),
        (dict(measure="topk_kl", anchor="old"), r"rule 'mine': the top-K measures are anchored on μ"),
        (dict(weight="tis"), r"rule 'mine': tis_cap must be a finite number > 0, got None"),
        (dict(tis_cap=2.0), r"rule 'mine': tis_cap applies only to weight 'tis' or 'seq_tis'"),
        (dict(name=""), r"a rule's name must be a non-empty string"),
    ],
)
def test_rules_are_validated(fields, message):
    args = dict(name="mine", low=0.1, high=0.1, anchor="mu", measure="binary_tv", description="d")
    with pytest.raises(ValueError, match=message):
        Rule(**(args | fields))
    with pytest.raises(ValueError, match=r"rule 'ppo': high must be a finite number ≥ 0, got nan"):
        RULES["ppo"].with_thresholds(high=math.nan)


def test_rules_import_no_torch():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises ImportError
        "import polars as pl\n"
        "from trustlens.rules.columns import evaluate_columns\n"
        "from trustlens.rules import RULES\n"
        "f = pl.DataFrame({'pi_logp': [-0.01], 'mu_logp': [-2.5], 'old_logp': [-0.5], 'advantage': [1.0],"
        " 'topk_tv': [0.5], 'topk_kl': [float('inf')], 'seq_logratio_mu': [2.49], 'seq_logratio_old': [0.49],"
        " 'seq_tokens': [1]})\n"
        "print(evaluate_columns([r for r in RULES if RULES[r].level != 'batch'], f).row(0))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(tuple(rule.blocks for rule in RULES.values() if rule.level != "batch"))
