import math

import numpy as np
import polars as pl
import pytest

from trustlens.analysis.seed_text import format_seed_table
from trustlens.analysis.seeds import (
    OUTCOME_SCHEMA,
    OUTCOMES,
    accuracy_drop,
    check_distinct_seeds,
    csv_safe,
    drop_noise,
    eval_window,
    format_mean_se,
    level_drops,
    mean_se,
    noise_tail,
    rule_and_seed,
    run_outcome,
    seed_table,
    settings,
    settings_key,
)
from trustlens.run import load_run
from trustlens.run.tables import write_run


def test_mean_se_by_hand():
    # 0.3, 0.5, 0.7: mean 0.5, sample sd 0.2, se 0.2/√3
    mean, se, n = mean_se([0.3, 0.5, 0.7])
    assert (mean, n) == (pytest.approx(0.5), 3)
    assert se == pytest.approx(0.2 / math.sqrt(3))
    assert mean_se([0.4, None, float("nan")]) == (0.4, None, 1)
    assert mean_se([]) == (None, None, 0)
    # 1, 2, 3, 6: mean 3, deviations −2, −1, 0, 3, s² = 14/3, se = √(14/3/4)
    assert mean_se([1, 2, 3, 6])[1] == pytest.approx(math.sqrt(14 / 12))


def _outcome(rule, seed, acc_final, collapse=None, block=0.1, within_noise=None):
    row = {k: None for k in OUTCOME_SCHEMA}
    row |= {"run": f"{rule}-seed{seed}", "rule": rule, "seed": seed, "acc_final": acc_final, "block_rate": block}
    row |= {"within_noise": within_noise}
    if collapse is not None:
        row |= {"collapse_step": collapse, "collapse_cause": "accuracy", "steps_to_collapse": float(collapse)}
    return row


def test_seed_table_by_hand():
    rows = [
        _outcome("ppo", 0, 0.30, within_noise=True),
        _outcome("ppo", 1, 0.50, within_noise=False),
        _outcome("ppo", 2, 0.70),
        _outcome("pg_is", 0, 0.10, collapse=10),
        _outcome("pg_is", 1, 0.20, collapse=20),
        _outcome("pg_is", 2, 0.40),
    ]
    table = seed_table(pl.DataFrame(rows, schema=OUTCOME_SCHEMA))
    assert table["rule"].to_list() == ["ppo", "pg_is"]
    ppo, pg = table.iter_rows(named=True)
    assert (ppo["n"], ppo["collapsed"], ppo["within_noise"]) == (3, 0, 1)
    assert pg["within_noise"] == 0  # no run knows its noise
    assert ppo["acc_final_mean"] == pytest.approx(0.5) and ppo["acc_final_se"] == pytest.approx(0.2 / math.sqrt(3))
    assert ppo["steps_to_collapse_mean"] is None
    assert ppo["block_rate_se"] == pytest.approx(0.0)
    # pg_is: mean 0.7/3, deviations (−0.1333, −0.0333, 0.1667), s² = 0.04667/2
    assert pg["acc_final_mean"] == pytest.approx(0.7 / 3)
    assert pg["acc_final_se"] == pytest.approx(math.sqrt((0.0466667 / 2) / 3), rel=1e-5)
    # steps to collapse over the two seeds that collapsed: 15 ± 5
    assert pg["collapsed"] == 2
    assert (pg["steps_to_collapse_mean"], pg["steps_to_collapse_se"]) == (pytest.approx(15.0), pytest.approx(5.0))
    stats = [f"{o}_{s}" for o in OUTCOMES for s in ("mean", "se")]
    assert table.columns == ["rule", "n", "collapsed", "within_noise", *stats]
    text = format_seed_table(table)
    assert "0.500 ± 0.115" in text and "2/3" in text and "1/3" in text and "15.000 ± 5.000" in text


def test_seed_table_refuses_a_rule_and_seed_twice_naming_both_runs():
    """A copied run would count its seed twice (n = 2, SE 0); runs without a seed are not compared."""
    rows = [_outcome("ppo", 0, 0.30), _outcome("ppo", 1, 0.50), {**_outcome("ppo", 0, 0.30), "run": "copy"}]
    with pytest.raises(ValueError) as err:
        seed_table(pl.DataFrame(rows, schema=OUTCOME_SCHEMA))
    assert str(err.value) == (
        "runs ppo-seed0 and copy are both rule ppo on seed 0: measured together, that seed would count "
        "twice; leave one of them out"
    )
    unseeded = [{**_outcome("ppo", None, 0.3), "run": name} for name in ("a", "b")]
    assert seed_table(pl.DataFrame(unseeded, schema=OUTCOME_SCHEMA))["n"].to_list() == [2]
    check_distinct_seeds([("a", "ppo", 0), ("b", "pg_is", 0), ("c", "ppo", 1)])  # distinct: passes


def test_settings_key_leaves_out_rule_and_seed_only(tmp_path):
    def run(name, **config):
        tokens = {"step": [0], "sample": [0], "pos": [0], "pi_logp": [-1.0]}
        return load_run(write_run(tmp_path / name, tokens=tokens, config=config))

    a = run("a", rule="ppo", seed=0, lr=6e-5, steps=250)
    b = run("b", rule="pg_is", seed=3, lr=6e-5, steps=250)
    c = run("c", rule="ppo", seed=0, lr=3e-5, steps=250)
    assert settings(a) == {"source": "hand-built", "lr": 6e-5, "steps": 250}
    assert settings_key(a) == settings_key(b) == '{"lr": 6e-05, "source": "hand-built", "steps": 250}'
    assert settings_key(c) != settings_key(a)
    assert rule_and_seed(b) == ("pg_is", 3)


def test_eval_window():
    # 10% of the evaluations, at least 3, at most all of them
    assert [eval_window(n) for n in (1, 2, 3, 26, 34, 35, 100)] == [1, 2, 3, 3, 3, 4, 10]


def test_accuracy_drop_by_hand():
    # 10 evaluations, w = 3: levels 0.4, 0.5, 0.6, 0.5, 0.4, 0.4, 0.4, 0.3 -> best 0.6, final 0.3
    acc = [0.3, 0.4, 0.5, 0.6, 0.7, 0.2, 0.3, 0.7, 0.2, 0.0]
    drop, noise = accuracy_drop(acc, eval_size=500)
    assert drop == pytest.approx(0.3)
    assert noise == drop_noise(10, 500, 0.39)  # p̄: the mean of the evaluations
    # ending on the best level: no drop; without eval_size no noise
    assert accuracy_drop([0.2, 0.3, 0.4, 0.5], eval_size=None) == (pytest.approx(0.0), None)
    assert accuracy_drop([], eval_size=500) == (None, None)
    # 3 evaluations or fewer are one level (w = all of them): the 0.562 → 0.312 fall of a short
    # run is no drop between levels, so none is given rather than 0
    assert accuracy_drop([0.562, 0.312], eval_size=500) == (None, None)
    assert accuracy_drop([0.5, 0.4, 0.3], eval_size=500) == (None, None)


def test_drop_noise_closed_forms():
    # one level (as many evaluations as w): a constant run never ends below its best
    assert drop_noise(3, 500, 0.4) == 0.0
    # 4 evaluations a1..a4 of one problem each, w = 3: acc_drop = max(a1 − a4, 0) / 3, which is
    # 1/3 with probability p(1 − p): the 95th percentile is 1/3 when p(1 − p) > 5%, else 0
    assert drop_noise(4, 1, 0.5) == pytest.approx(1 / 3)
    assert drop_noise(4, 1, 0.02) == 0.0


def test_drop_noise_puts_5_percent_of_constant_runs_outside():
    evaluations, eval_size, p = 26, 500, 0.42  # the claims runs
    noise = drop_noise(evaluations, eval_size, p)
    fresh = np.random.default_rng(1).binomial(eval_size, p, size=(4000, evaluations)) / eval_size
    drops = level_drops(fresh, eval_window(evaluations))
    assert np.mean(drops > noise) == pytest.approx(0.05, abs=0.015)
    # 2 standard errors of the difference of two levels would put about 17% outside
    two_se = 2 * math.sqrt(2 * p * (1 - p) / (3 * eval_size))
    assert np.mean(drops > two_se) == pytest.approx(0.17, abs=0.03)


def test_noise_tail_binomial_by_hand():
    assert noise_tail(0, 6) == pytest.approx(1.0)
    assert noise_tail(1, 6) == pytest.approx(1 - 0.95**6)  # 0.265
    assert noise_tail(2, 6) == pytest.approx(1 - 0.95**6 - 6 * 0.05 * 0.95**5)  # 0.033
    assert noise_tail(3, 3) == pytest.approx(0.05**3)


def test_format_and_csv_safety():
    assert format_mean_se(None, None) == "–"
    assert format_mean_se(0.5, None) == "0.500"
    assert format_mean_se(3.2e-5, 1e-6) == "3.20e-05 ± 1.00e-06"
    safe = csv_safe(pl.DataFrame({"rule": ["=HYPERLINK(1)", "ppo", "-1+2"], "x": [1, 2, 3]}))
    assert safe["rule"].to_list() == ["'=HYPERLINK(1)", "ppo", "'-1+2"]


def test_run_outcome_by_hand(tmp_path):
    # 12 steps, 2 samples each; rule ppo blocks every other A ≠ 0 token, and all tokens with μ < 0.1
    steps = 12
    rows = [(s, 2 * s + k) for s in range(steps) for k in range(2)]
    mu = [math.log(0.05) if k == 0 else math.log(0.5) for s, i in rows for k in [i % 2]]
    tokens = {
        "step": [s for s, _ in rows],
        "sample": [i for _, i in rows],
        "pos": [0] * len(rows),
        "mu_logp": mu,
        "old_logp": mu,
        "pi_logp": mu,
        "advantage": [0.0 if s == 0 else 1.0 for s, _ in rows],  # step 0: A = 0, never counted
        "blocked_ppo": [i % 2 == 0 and s > 0 for s, i in rows],
    }
    samples = {
        "step": [s for s, _ in rows],
        "sample": [i for _, i in rows],
        # mean reward 1 for steps 0–5, then 0: window 5, trailing mean < 0.5 first at step 8 (2/5)
        "reward": [1.0 if s < 6 else 0.0 for s, _ in rows],
    }
    metrics = {"step": [0, 6, 11], "name": ["eval/accuracy"] * 3, "value": [0.4, 0.22, 0.25]}  # 0.22 ≥ 0.4 / 2
    config = {"seed": 7, "eval_size": 100}
    run = load_run(write_run(tmp_path / "r", tokens=tokens, samples=samples, metrics=metrics, config=config))
    out = run_outcome(run)
    assert (out["rule"], out["seed"]) == ("ppo", 7)
    assert (out["acc_start"], out["acc_final"], out["acc_best"], out["acc_lowest"]) == (0.4, 0.25, 0.4, 0.22)
    # one level of all 3 evaluations: no drop to measure, so neither a drop nor its noise
    assert (out["acc_drop"], out["acc_drop_noise"], out["within_noise"]) == (None, None, None)
    assert (out["collapse_step"], out["collapse_cause"], out["steps_to_collapse"]) == (8, "reward", 8)
    assert out["block_rate"] == pytest.approx(0.5) and out["block_rate_low_mu"] == pytest.approx(1.0)
    assert out["k3_start"] == pytest.approx(0.0) and out["tv_end"] == pytest.approx(0.0)


def test_mismatch_ends_count_the_steps_with_token_rows(tmp_path):
    """k3_start is the mean over the first 10% of the 60 steps with token rows (6), even when the
    samples table holds only every 10th step (6 entries, whose own window would be 5)."""
    steps = 60
    log_rho = [0.1 if s == 5 else 0.0 for s in range(steps)]  # π_old − μ in log space, one token a step
    tokens = {
        "step": list(range(steps)),
        "sample": list(range(steps)),
        "pos": [0] * steps,
        "mu_logp": [-1.0] * steps,
        "old_logp": [-1.0 + r for r in log_rho],
        "pi_logp": [-1.0] * steps,
        "advantage": [1.0] * steps,
        "blocked_ppo": [False] * steps,
    }
    samples = {"step": list(range(0, steps, 10)), "sample": list(range(0, steps, 10)), "reward": [1.0] * 6}
    run = load_run(write_run(tmp_path / "r", tokens=tokens, samples=samples, config={"seed": 0}))
    out = run_outcome(run)
    k3 = math.exp(0.1) - 1 - 0.1
    assert out["k3_start"] == pytest.approx(k3 / 6, rel=1e-6) and out["k3_end"] == pytest.approx(0.0)


def test_line_margin_in_standard_errors_of_the_collapse_line():
    """a₀ = 0.4: ℓ = 0.2 and SE = √((0.2·0.8 + 0.4·0.6/4)/500) = 0.0209762 on 500 problems; the
    margin is the lowest later evaluation's distance from ℓ, below it or above."""
    import math

    from trustlens.analysis.seeds import line_margin

    se = math.sqrt((0.2 * 0.8 + 0.4 * 0.6 / 4) / 500)
    collapsed = [(0, 0.4), (10, 0.3), (20, 0.19), (30, 0.05)]  # collapsed at 20, and far below later
    assert line_margin(collapsed, "accuracy", 500) == pytest.approx(0.15 / se)
    stable = [(0, 0.4), (10, 0.25), (20, 0.3)]
    assert line_margin(stable, None, 500) == pytest.approx(0.05 / se)
    assert line_margin(collapsed, "reward", 500) is None
    assert line_margin(stable, None, None) is None and line_margin(stable[:1], None, 500) is None
