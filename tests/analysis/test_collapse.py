import math

import polars as pl
import pytest

from trustlens.analysis import CollapseConfig, detect_collapse, step_signals
from trustlens.analysis.collapse import ALERT_SCHEMA, alert_window
from trustlens.analysis.collapse.levels import learning_steps, mismatch_above_normal, model_kind
from trustlens.run import load_run
from trustlens.run.tables import write_run
from trustlens.synthetic import write_synthetic_run

STEPS = 12


def _entropy(step: int, sample: int, pos: int) -> float:
    if step < 8:
        return 1.0
    return {0: (0.1, 0.2), 1: (0.25, 0.25)}[sample % 2][pos]  # step mean 0.2


@pytest.fixture
def run(tmp_path):
    rows = [(s, 2 * s + k, p) for s in range(STEPS) for k in range(2) for p in range(2)]
    tokens = {
        "step": [r[0] for r in rows],
        "sample": [r[1] for r in rows],
        "pos": [r[2] for r in rows],
        "mu_logp": [-0.5] * len(rows),
        "old_logp": [-0.5] * len(rows),
        "pi_logp": [-0.5] * len(rows),
        "ratio": [1.0] * len(rows),
        "binary_tv": [0.0] * len(rows),
        "entropy": [_entropy(s, k, p) for s, k, p in rows],
        "advantage": [float(k + p) for _, k, p in rows],
        "blocked_ppo": [False] * len(rows),
    }
    samples = {
        "step": [s for s in range(STEPS) for _ in range(2)],
        "sample": [2 * s + k for s in range(STEPS) for k in range(2)],
        "reward": [1.0 if s < 10 else 0.0 for s in range(STEPS) for _ in range(2)],
    }
    grad = {s: 1.0 for s in range(STEPS)}
    metrics = {
        "step": [s for s in range(STEPS) for _ in range(2)],
        "rank": [0, 1] * STEPS,
        "name": ["actor/grad_norm"] * (2 * STEPS),
        "value": [v for s in range(STEPS) for v in ((9.0, 11.0) if s == 5 else (grad[s], grad[s]))],
    }
    return load_run(write_run(tmp_path / "run", tokens=tokens, samples=samples, metrics=metrics))


def test_step_signals(run):
    sig = step_signals(run)
    assert sig.columns == [
        *("step", "entropy", "k3_kl", "prob_diff_mean", "reward", "accuracy", "grad_norm", "blocked_ppo")
    ]
    assert sig["accuracy"].null_count() == STEPS  # no evaluation
    assert sig["step"].to_list() == list(range(STEPS))
    assert sig["entropy"].to_list() == pytest.approx([1.0] * 8 + [0.2] * 4)
    assert sig["grad_norm"][5] == pytest.approx(10.0) and sig["grad_norm"][4] == pytest.approx(1.0)
    assert sig["reward"].to_list() == [1.0] * 10 + [0.0] * 2
    assert sig["k3_kl"].to_list() == pytest.approx([0.0] * STEPS)
    assert sig["blocked_ppo"].to_list() == [0.0] * STEPS


def test_alerts_by_hand(run):
    # baseline: the trailing median of the unflagged steps, judged from the 5th (collapse_window(12));
    # x̄ is the trailing median of 3 steps; one flagged row opens an episode (confirm_steps=1)
    alerts = detect_collapse(run, CollapseConfig(confirm_steps=1))
    assert alerts.schema == pl.Schema(ALERT_SCHEMA)
    got = [(a["kind"], a["step"], a["end_step"], a["severity"]) for a in alerts.iter_rows(named=True)]
    assert got == [
        ("grad_norm_spike", 5, 5, "warning"),  # 10 > 4·1 (not smoothed); only an outcome is critical
        # step 8: x̄ = median(1, 1, 0.2) = 1; step 9: median(1, 0.2, 0.2) = 0.2 < 0.7
        ("entropy_collapse", 9, 11, "warning"),
        # step 10: x̄ = median(1, 1, 0) = 1; step 11: median(1, 0, 0) = 0 < 0.75, a warning: the
        # mean over the last 5 steps (1, 1, 1, 0, 0) = 0.6 is not below (1 − 0.4)·1
        ("reward_drop", 11, 11, "warning"),
    ]
    spike, entropy, reward = alerts.iter_rows(named=True)
    assert spike["value"] == pytest.approx(10.0) and spike["baseline"] == pytest.approx(1.0)
    assert spike["message"].startswith("step 5: gradient norm spiked to 10 from a baseline of 1 (10× baseline). Next: ")
    assert "gradient clip" in spike["message"]
    # the tokens of step 5 by |A| · π/μ · (1 − π), π/μ = 1 and π = e^−0.5 everywhere, so by
    # A = sample + pos: 12, then the two 11s (a tie: the lower sample first), then 10
    assert [(t["sample"], t["pos"]) for t in spike["tokens"]] == [(11, 1), (10, 1), (11, 0), (10, 0)]
    assert spike["samples"] == [11, 10]
    # entropy: the lowest-entropy token of step 9 first
    assert entropy["tokens"][0] == {"sample": 18, "update": 0, "pos": 0}
    assert entropy["samples"] == [18, 19]  # sample 18 holds the strongest token
    assert entropy["value"] == pytest.approx(0.2) and entropy["baseline"] == pytest.approx(1.0)
    assert reward["tokens"] == [] and reward["samples"] == []  # no A < 0 token, so no sample, to blame


def test_thresholds_matter(run):
    assert detect_collapse(run, CollapseConfig(z_warning=1e9, confirm_steps=1)).is_empty()
    # no step after the baseline
    assert detect_collapse(run, CollapseConfig(baseline_steps=12, confirm_steps=1)).is_empty()
    # one noisy row is not a change: the 1-step grad spike and the reward's last 2 steps raise nothing
    assert detect_collapse(run)["kind"].to_list() == ["entropy_collapse"]


def test_a_signal_hovering_about_its_threshold_is_one_alert(run):
    # k3 at its baseline for 10 steps, then 3 steps at 3× and 3 back, five times: the trailing
    # median is flagged on steps 11–13, 17–19, …, 35–37: 4 steps after the last flag before
    k3 = [1.0] * 10 + [3.0, 3.0, 3.0, 1.0, 1.0, 1.0] * 5
    signals = pl.DataFrame({"step": range(40), "k3_kl": k3}, schema={"step": pl.Int32, "k3_kl": pl.Float64})
    assert alert_window(40) == 5
    one = detect_collapse(run, signals=signals)  # merge_gap: alert_window(40) = 5 steps
    # the mismatch's x̄ is the median of mismatch_smooth = 9 steps: high from step 17 on (5 of 9 at 3×)
    assert one.select("kind", "step", "end_step").rows() == [("mismatch_growth", 17, 37)]
    trailing3 = CollapseConfig(mismatch_smooth=3, confirm_steps=1)
    assert detect_collapse(run, trailing3, signals=signals).select("step", "end_step").rows() == [(11, 37)]
    apart = detect_collapse(run, CollapseConfig(merge_gap=3, mismatch_smooth=3, confirm_steps=1), signals=signals)
    assert apart["step"].to_list() == [11, 17, 23, 29, 35]


def _lagged_run(path, lag: int | None):
    """40 steps of one token whose log μ − log π_old ramps from 0 to 1.5 over the first 10 steps
    (an engine 10 steps stale serving the starting weights) and stays there; config rollout_lag."""
    d = [1.5 * min(s, 10) / 10 for s in range(40)]
    tokens = {"step": list(range(40)), "sample": list(range(40)), "pos": [0] * 40, "advantage": [1.0] * 40}
    tokens |= {"mu_logp": [-0.5] * 40, "old_logp": [-0.5 - x for x in d], "pi_logp": [-0.5 - x for x in d]}
    config = None if lag is None else {"rollout_lag": lag}
    return load_run(write_run(path, tokens=tokens, rules=["ppo"], config=config))


def test_the_baseline_starts_once_a_stale_engine_serves_fresh_weights(tmp_path):
    # k3 = ρ − 1 − log ρ with ρ = π_old/μ = e^(−d): the first alert_window(40) = 5 steps (d ≤ 0.6,
    # median k3 0.041) sit far below the steady d = 1.5 (k3 0.72); a baseline frozen there called
    # the steady state growth (main bea0ccc: a warning over steps 7–39). The trailing baseline
    # follows the ramp (each step's k3 joins it while unflagged): no alert, with or without the lag
    early = detect_collapse(_lagged_run(tmp_path / "none", None))
    assert early.is_empty()
    # with rollout_lag 10 in the run's config the baseline is steps 10–14: nothing grows after it
    assert detect_collapse(_lagged_run(tmp_path / "lag", 10)).is_empty()
    # set by hand, baseline_start overrides the config either way
    lagged = _lagged_run(tmp_path / "lag2", 10)
    assert detect_collapse(lagged, CollapseConfig(baseline_start=0)).is_empty()


def test_a_stale_engine_does_not_move_the_reward_baseline(tmp_path):
    # the reward falls from 1 to 0 at step 10 in a run whose engine is 10 steps stale: the reward
    # measures the policy, not the gap to μ, so its baseline stays steps 0–4 (a baseline from step
    # 10 on would be all 0, with nothing to fall from)
    steps = 40
    tokens = {"step": list(range(steps)), "sample": list(range(steps)), "pos": [0] * steps}
    tokens |= {"pi_logp": [-0.5] * steps, "mu_logp": [-0.5] * steps, "advantage": [1.0] * steps}
    samples = {"step": list(range(steps)), "sample": list(range(steps))}
    samples["reward"] = [1.0 if s < 10 else 0.0 for s in range(steps)]
    run = load_run(write_run(tmp_path / "r", tokens=tokens, samples=samples, config={"rollout_lag": 10}))
    reward = detect_collapse(run).filter(pl.col("kind") == "reward_drop")
    assert reward.select("step", "severity").rows() == [(11, "critical")]


def _mismatch_run(tmp_path, k3_scale: float, *, drift: str = "ppo", rules=("dppo_binary_tv", "ppo")):
    """16 steps: μ and π_old differ by log ρ = d_s; from step 8 on d grows, and `drift`'s
    blocked share rises from 0 to 1/2 of the A ≠ 0 tokens."""
    steps = 16
    rows = [(s, 4 * s + k) for s in range(steps) for k in range(4)]
    d = [k3_scale * (1.0 if s < 8 else 3.0 + s - 8) for s, _ in rows]
    cols = {
        "step": [s for s, _ in rows],
        "sample": [i for _, i in rows],
        "pos": [0] * len(rows),
        "mu_logp": [-1.0] * len(rows),
        "old_logp": [-1.0 + x for x in d],
        "pi_logp": [-1.0 + x for x in d],
        "advantage": [1.0] * len(rows),
    }
    for r in rules:
        cols[f"blocked_{r}"] = [r == drift and s >= 8 and i % 2 == 0 for s, i in rows]
    return load_run(write_run(tmp_path / f"run{k3_scale}", tokens=cols, rules=list(rules)))


@pytest.mark.parametrize("scale", [1e-4, 1e-2])
def test_mismatch_growth_has_no_absolute_floor_on_the_change(tmp_path, scale):
    # k3 = ρ − 1 − log ρ ≈ d²/2: from 5e-9 (d = 1e-4) the median of steps 7–9 is 9× that: the same
    # change at any scale, a warning (the mismatch alone is never critical) once the level is lifted
    alerts = detect_collapse(_mismatch_run(tmp_path, scale), CollapseConfig(mismatch_k3_level=1e-12))
    mm = alerts.filter(pl.col("kind") == "mismatch_growth").row(0, named=True)
    assert mm["step"] == 12 and mm["severity"] == "warning"  # the median of 9 steps is high from 12
    assert mm["baseline"] == pytest.approx(math.exp(scale) - 1 - scale, rel=1e-3)  # logs stored as float32


def test_only_the_active_rule_alerts(tmp_path):
    # ppo's blocked share rises from 0 to 1/2, but the run trains with dppo_binary_tv (the first rule)
    run = _mismatch_run(tmp_path, 1e-3)
    assert run.active_rule == "dppo_binary_tv"
    assert detect_collapse(run).filter(pl.col("kind") == "blocked_drift").is_empty()
    drift = detect_collapse(run, rule="ppo").filter(pl.col("kind") == "blocked_drift")
    assert drift["signal"].to_list() == ["blocked_ppo"] and drift["severity"].to_list() == ["warning"]


def _reward_run(tmp_path, steps: int, fall: int):
    """`steps` steps of one token and two samples each: reward 1 until step `fall`, then 0."""
    tokens = {"step": list(range(steps)), "sample": [2 * s for s in range(steps)], "pos": [0] * steps}
    tokens |= {"pi_logp": [-0.5] * steps, "mu_logp": [-0.5] * steps, "advantage": [1.0] * steps}
    samples = {
        "step": [s for s in range(steps) for _ in range(2)],
        "sample": [2 * s + k for s in range(steps) for k in range(2)],
        "reward": [1.0 if s < fall else 0.0 for s in range(steps) for _ in range(2)],
    }
    return load_run(write_run(tmp_path / f"run{steps}", tokens=tokens, samples=samples, rules=["ppo"]))


def _accuracy_run(path, accuracy: dict[int, float], steps: int = 12):
    """`steps` steps of one token, flat reward, and held-out accuracy `accuracy` (step → value),
    logged by two ranks that differ by ±0.02."""
    tokens = {"step": list(range(steps)), "sample": list(range(steps)), "pos": [0] * steps}
    tokens |= {"pi_logp": [-0.5] * steps, "mu_logp": [-0.5] * steps, "advantage": [-1.0] * steps}
    samples = {"step": list(range(steps)), "sample": list(range(steps)), "reward": [0.5] * steps}
    metrics = {
        "step": [s for s in accuracy for _ in range(2)],
        "rank": [0, 1] * len(accuracy),
        "name": ["eval/accuracy"] * (2 * len(accuracy)),
        "value": [a + d for a in accuracy.values() for d in (-0.02, 0.02)],
    }
    return load_run(write_run(path, tokens=tokens, samples=samples, metrics=metrics, rules=["ppo"]))


ACCURACY = {0: 0.4, 2: 0.42, 4: 0.28, 6: 0.41, 8: 0.29, 10: 0.28}


def test_accuracy_drop_by_hand(tmp_path):
    # the line: (1 − 0.25) · 0.4 = 0.3; below it: steps 4, 8, 10; two in a row only at 8 and 10
    run = _accuracy_run(tmp_path / "acc", ACCURACY)
    sig = step_signals(run)
    assert sig.filter(pl.col("accuracy").is_not_null()).select("step", "accuracy").rows() == [
        (s, pytest.approx(a)) for s, a in ACCURACY.items()
    ]
    alerts = detect_collapse(run)
    # the line: 0.75 · the median of the last 5 unflagged evaluations (0.41 from step 4 on):
    # step 4 alone is below (one evaluation raises nothing), 6 back above, 8 and 10 below: one
    # alert, critical, from step 8, confirmed at 10
    assert alerts.select("kind", "step", "end_step", "severity", "critical_step").rows() == [
        ("accuracy_drop", 8, 10, "critical", 10)
    ]
    a = alerts.row(0, named=True)
    assert a["value"] == pytest.approx(0.28) and a["baseline"] == pytest.approx(0.41) and a["z"] is None
    assert a["message"].startswith(
        "steps 8–10: held-out accuracy fell to 0.28 from a baseline of 0.41 (0.68× baseline)"
    )
    # its drivers, at step 10 (which confirmed it): the A < 0 tokens by |A|·max(μ − π, 0) (the one token, at 0: π = μ)
    # and the lowest-reward samples
    assert a["tokens"] == [{"sample": 10, "update": 0, "pos": 0}] and a["samples"] == [10]


def test_accuracy_drop_thresholds(tmp_path):
    run = _accuracy_run(tmp_path / "acc", ACCURACY)

    def got(**cfg):
        alerts = detect_collapse(run, CollapseConfig(**cfg))
        return alerts.select("step", "end_step", "critical_step").rows()

    assert got(accuracy_evals=1) == [(4, 4, 4), (8, 10, 8)]  # one evaluation below the line is critical
    assert got(merge_gap=3) == got()  # an evaluations' episode ends when one is back above the line
    assert got(accuracy_evals=3) == []  # never three in a row
    assert got(accuracy_drop=0.35) == []  # the line 0.2665: no evaluation below it
    with pytest.raises(ValueError, match="accuracy_evals"):
        got(accuracy_evals=0)


def test_accuracy_drop_needs_a_start(tmp_path):
    assert detect_collapse(_accuracy_run(tmp_path / "one", {0: 0.4})).is_empty()  # one evaluation
    assert detect_collapse(_accuracy_run(tmp_path / "zero", {0: 0.0, 5: 0.0})).is_empty()  # nothing to fall from


def test_alert_window_is_capped_so_long_runs_alert_as_early():
    assert [alert_window(n) for n in (12, 100, 150, 250, 10_000)] == [5, 10, 15, 15, 15]


@pytest.mark.parametrize("steps", [150, 400])
def test_a_reward_fall_is_critical_after_the_same_steps_in_any_long_run(tmp_path, steps):
    # the reward falls from 1 to 0 at step 100 (steps 100, 101, … at 0): the critical mean over
    # the last 10 steps is (10 − k)/10 after k steps at 0, below 0.56 from k = 5 (step 104), in a
    # run of 150 steps as in one of 400 (with 10% of 400 = 40 steps the mean would wait until k = 18)
    run = _reward_run(tmp_path, steps, fall=100)
    reward = detect_collapse(run).filter(pl.col("kind") == "reward_drop").row(0, named=True)
    assert (reward["step"], reward["critical_step"]) == (101, 104)
    # with the window and threshold set by hand: 15 steps, 0.6 → k = 7 (step 106)
    custom = detect_collapse(run, CollapseConfig(reward_window=15, reward_critical=0.4))
    assert custom.filter(pl.col("kind") == "reward_drop")["critical_step"].to_list() == [106]
    assert reward["severity"] == "critical" and reward["baseline"] == 1.0


def test_synthetic_collapse_detected(tmp_path):
    run = load_run(
        write_synthetic_run(
            tmp_path / "r", steps=24, samples_per_step=32, seq_len=24, rules=["ppo", "dppo_binary_tv"], collapse_at=16
        )
    )
    alerts = detect_collapse(run)
    first = {
        k: alerts.filter(pl.col("kind") == k)["step"].min()
        for k in ("entropy_collapse", "mismatch_growth", "grad_norm_spike")
    }
    assert all(v is not None and 16 <= v <= 20 for v in first.values()), first
    assert alerts.filter(pl.col("step") < 16).is_empty()


def test_healthy_run_is_quiet(tmp_path):
    run = load_run(
        write_synthetic_run(tmp_path / "r", steps=24, samples_per_step=32, seq_len=24, rules=["ppo"], seed=3)
    )
    assert detect_collapse(run).is_empty()


def test_without_mu_or_extras(tmp_path):
    run = load_run(
        write_synthetic_run(tmp_path / "r", steps=6, samples_per_step=8, seq_len=8, rules=["ppo"], with_mu=False)
    )
    sig = step_signals(run)
    assert sig["k3_kl"].null_count() == sig.height
    assert detect_collapse(run, signals=sig).schema == pl.Schema(ALERT_SCHEMA)
    bare = load_run(
        write_run(tmp_path / "bare", tokens={"step": [0, 1], "sample": [0, 1], "pos": [0, 0], "pi_logp": [-1.0, -1.0]})
    )
    sig = step_signals(bare)
    assert sig["reward"].null_count() == 2 and sig["grad_norm"].null_count() == 2
    assert detect_collapse(bare).is_empty()


def _signal_run(tmp_path, steps: int):
    """A run of `steps` steps with one token and one sample each, for `detect_collapse(signals=…)`
    on hand-built signal tables (the run only supplies the driving tokens)."""
    tokens = {
        "step": list(range(steps)),
        "sample": list(range(steps)),
        "pos": [0] * steps,
        "mu_logp": [-0.5] * steps,
        "pi_logp": [-0.5] * steps,
        "advantage": [-1.0] * steps,
        "entropy": [1.0] * steps,
    }
    samples = {"step": list(range(steps)), "sample": list(range(steps)), "reward": [1.0] * steps}
    return load_run(write_run(tmp_path / "signals", tokens=tokens, samples=samples))


def _signals(steps: int, **columns: list[float]) -> pl.DataFrame:
    """A step_signals table: flat entropy 1, k3 1e-3 and reward 0.5 unless given."""
    base = {"entropy": [1.0] * steps, "k3_kl": [1e-3] * steps, "reward": [0.5] * steps}
    return pl.DataFrame({"step": list(range(steps)), **base, **columns}).with_columns(pl.col("step").cast(pl.Int32))


def _severities(alerts: pl.DataFrame) -> list[tuple]:
    return [
        (a["kind"], a["step"], a["end_step"], a["severity"], a["critical_step"]) for a in alerts.iter_rows(named=True)
    ]


def test_mismatch_growth_alone_is_a_warning(tmp_path):
    # 20 steps: baseline = the first collapse_window(20) = 5; k3 grows 5× from step 8 with flat
    # reward and entropy. x̄ at step 9 = median(1e-3, 5e-3, 5e-3) = 5e-3 > 2·1e-3 (z: the flat
    # baseline's scale is rel_floor·m = 5e-5, z = 80)
    k3 = [1e-3] * 8 + [5e-3] * 12
    alerts = detect_collapse(_signal_run(tmp_path, 20), signals=_signals(20, k3_kl=k3))
    assert _severities(alerts) == [("mismatch_growth", 12, 19, "warning", None)]
    assert alerts["value"][0] == pytest.approx(5e-3) and alerts["baseline"][0] == pytest.approx(1e-3)


def test_growing_mismatch_and_falling_reward_is_critical_where_the_reward_window_falls(tmp_path):
    # k3 grows 5× from step 8 and the reward falls from 0.5 to 0.1 at step 8. reward_drop warns
    # at step 9 (x̄ = median(0.5, 0.1, 0.1) = 0.1 < 0.75·0.5); r̄, the mean over the last 5 steps:
    # step 9 (0.5·3 + 0.1·2)/5 = 0.34 ≥ 0.6·0.5 = 0.3, step 10 (0.5·2 + 0.1·3)/5 = 0.26 < 0.3:
    # critical from step 10
    k3 = [1e-3] * 8 + [5e-3] * 12
    reward = [0.5] * 8 + [0.1] * 12
    alerts = detect_collapse(_signal_run(tmp_path, 20), signals=_signals(20, k3_kl=k3, reward=reward))
    assert _severities(alerts) == [
        ("reward_drop", 9, 19, "critical", 11),  # confirmed by 3 flagged rows in a row (9, 10, 11)
        ("mismatch_growth", 12, 19, "warning", None),  # the median of 9 steps: high from 12
    ]
    drop = alerts.row(0, named=True)
    assert drop["value"] == pytest.approx(0.1) and drop["z"] == pytest.approx((0.1 - 0.5) / (0.05 * 0.5))
    # the mismatch warning came after it: no evidence (tests/analysis/test_long_runs.py has some)
    assert (drop["evidence"], drop["evidence_start_step"]) == ([], 9)
    assert drop["message"].startswith(
        "steps 9–19: mean reward dropped to 0.1 from a baseline of 0.5 (0.2× baseline). Next: open the Collapse "
        "signals page"
    )


def test_a_reward_that_falls_short_of_the_critical_fraction_only_warns(tmp_path):
    run = _signal_run(tmp_path, 20)
    # the reward falls by a third: x̄ = 2/3·m < 0.75·m warns, but r̄ never goes below 0.6·m
    reward = [0.6] * 8 + [0.4] * 12
    assert _severities(detect_collapse(run, signals=_signals(20, reward=reward))) == [
        ("reward_drop", 9, 19, "warning", None)
    ]


def test_a_noisy_reward_is_critical_when_its_window_mean_falls(tmp_path):
    run = _signal_run(tmp_path, 20)
    # x̄ = median(0.1, 0.5, 0.1) = 0.1 at step 10 and median(0.1, 0.5, 0) at 12
    # warns (between, median(0.5, 0.1, 0.5) = 0.5 does not); r̄ = 0.34, 0.34, then at step 12
    # mean(0.1, 0.5, 0.1, 0.5, 0) = 0.24 < 0.6·0.5 makes it critical there
    noisy = [0.5] * 8 + [0.1, 0.5, 0.1, 0.5, 0.0] + [0.5] * 7
    assert _severities(detect_collapse(run, CollapseConfig(confirm_steps=1), signals=_signals(20, reward=noisy))) == [
        ("reward_drop", 10, 12, "critical", 12)
    ]
    # flagged rows 10 and 12 are not in a row: by default (confirm_steps=3) no alert
    assert detect_collapse(run, signals=_signals(20, reward=noisy)).is_empty()


def test_the_critical_fraction_is_a_config_field(tmp_path):
    run, signals = _signal_run(tmp_path, 20), _signals(20, reward=[0.5] * 8 + [0.1] * 12)
    # r̄ per step from 9 on: 0.34, 0.26, 0.18, 0.1, 0.1, …
    # (the alert is raised at the third flagged row, 11: a critical r̄ before it is critical there)
    for fraction, got in [(0.9, None), (0.7, 12), (0.5, 11), (0.4, 11)]:
        alerts = detect_collapse(run, CollapseConfig(reward_critical=fraction), signals=signals)
        assert alerts.filter(pl.col("kind") == "reward_drop")["critical_step"].to_list() == [got], fraction


def test_a_mismatch_inside_the_normal_range_raises_no_alert(tmp_path):
    # the same 5× growth as above, but from 1e-4 to 5e-4 (below the dense range, k3 ≥ 1e-3, with
    # prob_diff_mean 0.001 below 0.005): no alert; a MoE run (no published k3 range) is judged on
    # prob_diff_mean alone, which lifts it once that reaches 0.005
    run = _signal_run(tmp_path, 20)
    k3 = [1e-4] * 8 + [5e-4] * 12
    assert detect_collapse(run, signals=_signals(20, k3_kl=k3, prob_diff_mean=[1e-3] * 20)).is_empty()
    k3 = [2e-4] * 8 + [2e-3] * 12
    assert _severities(detect_collapse(run, signals=_signals(20, k3_kl=k3, prob_diff_mean=[1e-3] * 20))) == [
        ("mismatch_growth", 12, 19, "warning", None)
    ]
    run.manifest["model_kind"] = "MoE"
    assert detect_collapse(run, signals=_signals(20, k3_kl=k3, prob_diff_mean=[1e-3] * 20)).is_empty()
    diff = [1e-3] * 8 + [6e-3] * 12
    assert _severities(detect_collapse(run, signals=_signals(20, k3_kl=k3, prob_diff_mean=diff))) == [
        ("mismatch_growth", 12, 19, "warning", None)
    ]


def test_model_kind_is_read_defensively(tmp_path):
    run = _signal_run(tmp_path, 4)
    assert model_kind(run) == "dense"
    for given, kind in (("MoE ", "moe"), ("", "dense"), (3, "dense"), (None, "dense")):
        run.manifest["model_kind"] = given
        assert model_kind(run) == kind


def test_mismatch_above_normal_by_hand():
    signals = _signals(4, k3_kl=[5e-4, 2e-3, 1e-3, 5e-4], prob_diff_mean=[1e-3, 1e-3, 1e-3, 5e-3])
    assert mismatch_above_normal(signals, "dense", 1).tolist() == [False, True, True, True]
    assert mismatch_above_normal(signals, "moe", 1).tolist() == [False, False, False, True]
    # smoothed: the median of the last 2 steps' k3 (1.25e-3 at step 1, 1.5e-3, 7.5e-4)
    assert mismatch_above_normal(signals, "moe", 2).tolist() == [False, False, False, False]
    assert mismatch_above_normal(signals, "dense", 2).tolist() == [False, True, True, False]


def test_an_entropy_fall_while_the_reward_rises_is_info(tmp_path):
    # entropy 1 → 0.2 from step 8 (critical: below 0.4·m); with the reward rising 0.5 → 1 from step
    # 6 (r̄ over 5 steps above the baseline median 0.5 from step 6) every flagged step is
    # learning: "info"; with a flat reward the same fall is critical from its first step
    run = _signal_run(tmp_path, 20)
    entropy = [1.0] * 8 + [0.2] * 12
    rising = [0.5] * 6 + [1.0] * 14
    alerts = detect_collapse(run, signals=_signals(20, entropy=entropy, reward=rising))
    assert _severities(alerts) == [("entropy_collapse", 9, 19, "info", None)]
    assert "while accuracy or reward rose (a policy sharpening as it learns). Next: " in alerts["message"][0]
    assert _severities(detect_collapse(run, signals=_signals(20, entropy=entropy))) == [
        ("entropy_collapse", 9, 19, "warning", None)
    ]
    # held-out accuracy above its first evaluation counts as learning too
    accuracy = [0.3] + [None] * 9 + [0.5] + [None] * 9
    alerts = detect_collapse(run, signals=_signals(20, entropy=entropy, accuracy=accuracy))
    assert _severities(alerts) == [("entropy_collapse", 9, 19, "warning", None)]  # step 9 came before it
    assert learning_steps(_signals(20, accuracy=accuracy), 5, 5).tolist() == [False] * 10 + [True] * 10
