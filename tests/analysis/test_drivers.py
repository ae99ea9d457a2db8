"""The driving tokens and samples of collapse alerts (trustlens.analysis.collapse.drivers), scored by hand."""

import math

import pytest

from trustlens.analysis.collapse import alert_drivers, driver_scores
from trustlens.run import load_run
from trustlens.run.tables import write_run

# One row per token of step 0: (sample, pos, token, A, μ, π, blocked_ppo, blocked_dppo_binary_tv),
# the decisions as trustlens.rules.evaluate_all takes them; score = |A| · π/μ · (1 − π)
ROWS = [
    (0, 0, "a", 2.0, 0.5, 0.25, False, False),  # 2 · 0.5 · 0.75 = 0.75
    (0, 1, "b", -1.0, 0.1, 0.4, False, False),  # 1 · 4 · 0.6 = 2.4 (A < 0, π > μ: never blocked)
    (0, 2, "<eos>", -3.0, 1.0, 1.0, False, False),  # π = 1: 3 · 1 · 0 = 0, no gradient
    (1, 0, "c", 1.0, 0.2, 0.5, True, True),  # 1 · 2.5 · 0.5 = 1.25; ratio 2.5 > 1.2, TV 0.3 > 0.15
    (1, 1, "d", 0.0, 0.5, 0.9, False, False),  # A = 0: no gradient
    (1, 2, "e", -1.0, 0.96, 0.8, False, True),  # 1 · (0.8/0.96) · 0.2 = 1/6; ratio 0.83 ≥ 0.8, TV 0.16
    (2, 0, "f", 0.5, 0.5, 0.5, False, False),  # 0.5 · 1 · 0.5 = 0.25
]
SPIKE = {"step": 0, "kind": "grad_norm_spike", "signal": "grad_norm"}


def _tokens(sample, pos, advantage, mu, pi) -> dict:
    """The token columns of step 0, μ and π given as probabilities."""
    return {
        "step": [0] * len(sample),
        "sample": sample,
        "pos": pos,
        "advantage": advantage,
        "mu_logp": [math.log(p) for p in mu],
        "pi_logp": [math.log(p) for p in pi],
    }


def _run(tmp_path, rules: tuple[str, ...]):
    cols = list(zip(*ROWS, strict=True))
    tokens = _tokens(cols[0], cols[1], *cols[3:6]) | {
        "token": cols[2],
        "ratio": [pi / mu for mu, pi in zip(cols[4], cols[5], strict=True)],
    }
    given = {"ppo": cols[6], "dppo_binary_tv": cols[7]}
    tokens |= {f"blocked_{r}": given[r] for r in rules}
    return load_run(write_run(tmp_path / "run", tokens=tokens))


def _scores(run) -> dict[tuple[int, int], float]:
    got = driver_scores(run, **SPIKE).collect()
    return {(s, p): v for s, _, p, v in got.select("sample", "update", "pos", "score").rows()}


@pytest.mark.parametrize(
    ("rules", "left_out"),
    [
        (("ppo", "dppo_binary_tv"), {(1, 0)}),  # the active rule ppo blocks (1, 0); dppo's (1, 2) stays
        (("dppo_binary_tv", "ppo"), {(1, 0), (1, 2)}),  # dppo_binary_tv active: it blocks both
        ((), set()),  # no rule named: nothing is left out as blocked
    ],
)
def test_grad_norm_spike_scores_the_gradient_of_unblocked_tokens(tmp_path, rules, left_out):
    run = _run(tmp_path, rules)
    assert run.active_rule == (rules[0] if rules else None)
    every = {(0, 0): 0.75, (0, 1): 2.4, (1, 0): 1.25, (1, 2): 1 / 6, (2, 0): 0.25}  # π = 1 and A = 0: not listed
    expected = {k: v for k, v in every.items() if k not in left_out}
    assert _scores(run) == pytest.approx(expected, rel=1e-6)


def test_grad_norm_spike_drivers_by_hand(tmp_path):
    run = _run(tmp_path, ("ppo", "dppo_binary_tv"))
    samples, tokens = alert_drivers(run, SPIKE, top_tokens=10, top_samples=5)
    # 2.4, 0.75, 0.25, 1/6; the old |A| · π/μ put <eos> (3) first and kept the blocked (1, 0)
    assert tokens == [
        {"sample": 0, "update": 0, "pos": 1},
        {"sample": 0, "update": 0, "pos": 0},
        {"sample": 2, "update": 0, "pos": 0},
        {"sample": 1, "update": 0, "pos": 2},
    ]
    # by each sample's strongest token: sample 0 2.4, sample 2 0.25, sample 1 1/6
    assert samples == [0, 2, 1]
    assert alert_drivers(run, SPIKE, top_tokens=2, top_samples=1) == ([0], tokens[:2])


def test_ties_go_to_the_lowest_sample_update_and_position(tmp_path):
    tokens = {
        "step": [0] * 4,
        "sample": [3, 3, 1, 1],
        "update": [1, 0, 1, 1],
        "pos": [0, 0, 1, 0],
        "advantage": [1.0] * 4,
        "mu_logp": [math.log(0.5)] * 4,
        "pi_logp": [math.log(0.5)] * 4,
        "ratio": [1.0] * 4,
    }
    run = load_run(write_run(tmp_path / "ties", tokens=tokens))
    samples, got = alert_drivers(run, SPIKE, top_tokens=4, top_samples=2)
    assert [(t["sample"], t["update"], t["pos"]) for t in got] == [(1, 1, 0), (1, 1, 1), (3, 0, 0), (3, 1, 0)]
    assert samples == [1, 3]
    assert driver_scores(run, **SPIKE).collect()["score"].to_list() == pytest.approx([0.5] * 4)  # 1 · 1 · 0.5


def test_reward_drop_names_the_samples_of_its_negative_updates(tmp_path):
    # step 0: samples 0-1 are a group that all failed (reward 0, A = 0: no gradient), the others
    # come from groups that split; score = |A| · max(μ − π, 0) over the A < 0 tokens
    rows = [  # (sample, pos, A, μ, π)
        (0, 0, 0.0, 0.9, 0.1),  # A = 0: not ranked, though μ − π = 0.8 is the largest drop
        (1, 0, 0.0, 0.9, 0.2),
        (2, 0, -1.0, 0.5, 0.4),  # 1 · 0.1 = 0.1
        (2, 1, -1.0, 0.3, 0.6),  # π > μ: 0
        (3, 0, 1.0, 0.9, 0.1),  # A > 0: not ranked
        (4, 0, -0.5, 0.8, 0.2),  # 0.5 · 0.6 = 0.3
        (4, 1, -0.5, 0.5, 0.45),  # 0.5 · 0.05 = 0.025
        (5, 0, 0.5, 0.5, 0.5),  # A > 0: not ranked
        (6, 0, -1.0, 0.5, 0.3),  # 1 · 0.2 = 0.2
    ]
    tokens = _tokens(*zip(*rows, strict=True))
    samples = {"step": [0] * 7, "sample": list(range(7)), "reward": [0.0, 0.0, 0.0, 1.0, 0.5, 1.0, 0.0]}
    run = load_run(write_run(tmp_path / "run", tokens=tokens, samples=samples))
    for kind in ("reward_drop", "accuracy_drop"):
        got, top = alert_drivers(run, {"step": 0, "kind": kind, "signal": "reward"}, top_tokens=10, top_samples=5)
        # 0.3, 0.2, 0.1, 0.025, 0
        assert [(t["sample"], t["pos"]) for t in top] == [(4, 0), (6, 0), (2, 0), (4, 1), (2, 1)]
        # by each sample's strongest token: 4 (0.3), 6 (0.2), 2 (0.1), not by the mean (6's 0.2
        # before 4's (0.3 + 0.025)/2); the A = 0 samples 0 and 1, with the lowest reward and the
        # largest μ − π, are not named, nor is any A > 0 sample
        assert got == [4, 6, 2]
        assert alert_drivers(run, {"step": 0, "kind": kind, "signal": "reward"}, 1, 1) == ([4], top[:1])
