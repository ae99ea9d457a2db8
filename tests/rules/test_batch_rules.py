"""The batch rules Clip-Cov and KL-Cov (trustlens.rules.batch): hand-checked selections, a float64
transcription of the paper's formulas, the seeded draw, the recorder's decision over a whole
record call (also on a sampled run), and the refusal to decide them again from recorded rows."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from trustlens import Keep, TokenRecorder, load_run
from trustlens.analysis import threshold_sweep, with_rules
from trustlens.rules import RULES, Rule, evaluate
from trustlens.rules.batch import covariance, select
from trustlens.rules.columns import evaluate_columns
from trustlens.run import blocked_column


def _batch(gen, b=16, t=40, spread=0.3):
    """float32 inputs; A of both signs and 0, padding; log π spread so that cov reaches (1, 5)."""
    old = (torch.randn(b, t, generator=gen) * 1.5 - 2).clamp(max=-1e-3)
    pi = (old + 0.05 * torch.randn(b, t, generator=gen)).clamp(max=-1e-3)
    adv = torch.randn(b, generator=gen) * 2
    adv[0] = 0.0
    lengths = torch.randint(t // 2, t + 1, (b, 1), generator=gen)
    return dict(
        pi_logp=pi,
        mu_logp=old,
        old_logp=old,
        advantages=adv,
        response_mask=torch.arange(t) < lengths,
    )


def _paper(rule, logp, adv, clipped, draw):
    """The paper's selection in float64 (Cui et al. 2025, eqs. of Clip-Cov / KL-Cov), over the
    response tokens: Cov_i = (log π_i − (1/N) Σ_j log π_j)·(A_i − (1/N) Σ_j A_j); Clip-Cov draws
    ⌊r·N⌋ (at least 1) of the unclipped tokens with ω_low < Cov < ω_high in the order `draw`
    gives; KL-Cov takes the ⌊k·N⌋ (at least 1) of largest Cov. A = 0 tokens left out after."""
    n = len(logp)
    mean_lp = sum(float(v) for v in logp) / n
    mean_a = sum(float(v) for v in adv) / n
    cov = [(float(lp) - mean_lp) * (float(a) - mean_a) for lp, a in zip(logp, adv, strict=True)]
    k = max(int(rule.cov_ratio * n), 1)
    if rule.cov == "kl":
        chosen = sorted(range(n), key=lambda i: -cov[i])[:k]
    else:
        cand = [i for i in range(n) if not clipped[i] and rule.cov_low < cov[i] < rule.cov_high]
        chosen = [cand[j] for j in draw(len(cand))[:k]]
    return {i for i in chosen if adv[i] != 0}


def test_hand_checked_selection():
    # log π = [-1, -3, -2, -2], A = [2, -2, 0, 0]: means -2 and 0, cov = [2, 2, 0, 0]
    logp, adv = np.array([-1.0, -3.0, -2.0, -2.0]), np.array([2.0, -2.0, 0.0, 0.0])
    assert covariance(logp, adv).tolist() == [2.0, 2.0, 0.0, 0.0]
    kl = replace(RULES["kl_cov"], cov_ratio=0.5)  # k = 2: the two of cov 2
    assert select(kl, logp, adv, None, (0, 0)).tolist() == [True, True, False, False]
    clip = replace(RULES["clip_cov"], cov_ratio=0.25)  # k = 1 of the candidates {0, 1} (1 < 2 < 5)
    picked = select(clip, logp, adv, np.zeros(4, bool), (0, 0))
    assert picked.sum() == 1 and picked[:2].any()
    # a clipped token is no candidate; a cov outside (cov_low, cov_high) neither
    assert select(clip, logp, adv, np.array([True, False, False, False]), (0, 0)).tolist() == [
        False,
        True,
        False,
        False,
    ]
    assert not select(replace(clip, cov_low=2.0), logp, adv, np.zeros(4, bool), (0, 0)).any()


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_zero_probability_token_has_no_covariance_and_leaves_the_others_theirs():
    # log π = [-1, -3, -inf, -2], A = [2, -2, 1, 0]: over the three finite tokens the means are
    # -2 and 0, cov = [2, 2, NaN, 0] (a mean over all four would be -inf: every cov ±inf or NaN)
    logp, adv = np.array([-1.0, -3.0, -math.inf, -2.0]), np.array([2.0, -2.0, 1.0, 0.0])
    assert np.array_equal(covariance(logp, adv), [2.0, 2.0, math.nan, 0.0], equal_nan=True)
    kl = replace(RULES["kl_cov"], cov_ratio=1.0)  # k = 4: every token with a covariance, A = 0 left out
    assert select(kl, logp, adv, None, (0, 0)).tolist() == [True, True, False, False]
    clip = replace(RULES["clip_cov"], cov_ratio=1.0)  # candidates: cov 2 in (1, 5)
    assert select(clip, logp, adv, np.zeros(4, bool), (0, 0)).tolist() == [True, True, False, False]
    nothing = np.full(3, -math.inf)  # no token with a covariance: none selected
    assert np.isnan(covariance(nothing, np.ones(3))).all()
    assert not select(kl, nothing, np.ones(3), None, (0, 0)).any()


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov"])
def test_equals_float64_transcription_of_the_paper(gen, name):
    x = _batch(gen)
    rule = replace(RULES[name], cov_ratio=0.05)
    mask = x["response_mask"]
    got = evaluate(rule, **x, seed=(3, 1))
    clipped = (
        evaluate(replace(rule, name="ppo_old", cov=None, cov_ratio=None, cov_low=None, cov_high=None), **x)
        if name == "clip_cov"
        else None
    )
    # the same draw as the rule's: numpy's generator seeded by (step, update)
    want = _paper(
        rule,
        x["pi_logp"][mask].double().tolist(),
        x["advantages"][:, None].expand_as(mask)[mask].tolist(),
        None if clipped is None else clipped[mask].tolist(),
        lambda n: np.random.default_rng([3, 1]).permutation(n).tolist(),
    )
    selected = set(torch.nonzero(got[mask] & ~(clipped[mask] if clipped is not None else False)).flatten().tolist())
    assert selected == want and len(want) > 0
    assert not (got & ~mask).any()
    if clipped is not None:
        assert torch.equal(got & clipped, clipped & mask)  # Clip-Cov blocks its PPO clip too


def test_clip_cov_draw_is_seeded_by_step_and_update(gen):
    x = _batch(gen)
    x["advantages"][0] = 1.0  # every draw lands on an A ≠ 0 token: the counts agree
    rule = replace(RULES["clip_cov"], cov_ratio=0.02)
    a, b = evaluate(rule, **x, seed=(5, 0)), evaluate(rule, **x, seed=(5, 0))
    assert torch.equal(a, b)
    others = [evaluate(rule, **x, seed=(5, u)) for u in range(1, 4)]
    assert any(not torch.equal(a, o) for o in others)
    assert all(int(o.sum()) == int(a.sum()) for o in others)  # same count, another draw


def test_recorder_decides_over_the_whole_call_also_when_sampled(tmp_path, gen):
    x = _batch(gen)
    rules = [replace(RULES["clip_cov"], cov_ratio=0.02), replace(RULES["kl_cov"], cov_ratio=0.02)]
    ids = torch.randint(0, 50, x["pi_logp"].shape, generator=gen)
    for keep in (None, Keep(rate=0.05, low_mu=1e-3)):
        folder = tmp_path / ("full" if keep is None else "kept")
        with TokenRecorder(folder, rules=rules, keep=keep) as rec:
            rec.record(4, update=2, token_ids=ids, sample_ids=torch.arange(len(ids)), **x)
        tokens = load_run(folder).tokens.collect()
        for rule in rules:
            want = evaluate(rule, **x, seed=(4, 2))
            at = (tokens["sample"].to_numpy(), tokens["pos"].to_numpy())
            assert tokens[blocked_column(rule.name)].to_list() == want[at].tolist()
            if keep is None:
                assert int(tokens[blocked_column(rule.name)].sum()) == int(want.sum()) > 0


def test_not_decided_again_from_recorded_rows(tmp_path, gen):
    x = _batch(gen)
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        rec.record(0, token_ids=torch.zeros_like(x["pi_logp"], dtype=torch.long), **x)
    run = load_run(tmp_path / "run")
    for call in (
        lambda: with_rules(run, ["kl_cov"]).collect(),
        lambda: threshold_sweep(run, ["clip_cov"]),
        lambda: evaluate_columns(["clip_cov"], run.tokens.collect()),
    ):
        with pytest.raises(ValueError, match=r"'(kl|clip)_cov' selects a share of each record call's tokens"):
            call()


@pytest.mark.parametrize(
    "name, fields, message",
    [
        ("clip_cov", dict(cov_ratio=0.0), r"rule 'clip_cov': cov_ratio must be a finite number > 0, got 0.0"),
        ("kl_cov", dict(cov_ratio=1.5), r"rule 'kl_cov': cov_ratio is a share .* in \(0, 1\], got 1.5"),
        ("clip_cov", dict(cov_low=6.0), r"rule 'clip_cov': cov_low must be ≤ cov_high, got cov_low=6.0 > cov_high=5.0"),
        ("clip_cov", dict(cov_high=math.nan), r"rule 'clip_cov': cov_high must be a finite number, got nan"),
        ("kl_cov", dict(kl_coef=-1.0), r"rule 'kl_cov': kl_coef must be a finite number ≥ 0, got -1.0"),
        ("kl_cov", dict(cov_low=1.0), r"rule 'kl_cov': cov_low does not apply to cov 'kl'"),
        ("ppo", dict(cov_ratio=0.1), r"rule 'ppo': cov_ratio apply only to a batch rule"),
        ("kl_cov", dict(anchor="mu"), r"rule 'kl_cov': a batch rule measures π against π_old"),
    ],
)
def test_bad_fields_name_the_rule_and_field(name, fields, message):
    with pytest.raises(ValueError, match=message):
        replace(RULES[name], **fields)


def test_manifest_round_trip():
    for name in ("clip_cov", "kl_cov"):
        rule = replace(RULES[name], name=f"my_{name}", cov_ratio=0.01)
        assert Rule.from_manifest(rule.name, rule.manifest_entry()) == rule
    assert "cov" not in RULES["ppo"].manifest_entry()
