"""The outcome detectors' tests on hand-checked series: held-out accuracy against its binomial
noise (the lower CUSUM's change point, `AccuracyFall`) and the reward's standard error."""

import math

import polars as pl
import pytest

from trustlens.analysis import detect_collapse
from trustlens.analysis.collapse import CollapseConfig
from trustlens.analysis.collapse.heldout import AccuracyFall, eval_size
from trustlens.run import load_run
from trustlens.run.tables import write_run

N = 500  # problems per evaluation
# the standard error of an evaluation minus the median of 5 (p = 0.5): √(0.25/500 · (1 + π/10))
SE5 = math.sqrt(0.25 / N * (1 + math.pi / 10))


def _run(tmp_path, steps: int):
    """A run of `steps` steps with one token and one sample each (detect_collapse(signals=…)
    reads only its driving tokens)."""
    tokens = {"step": list(range(steps)), "sample": list(range(steps)), "pos": [0] * steps}
    tokens |= {"mu_logp": [-0.5] * steps, "pi_logp": [-0.5] * steps, "advantage": [-1.0] * steps}
    samples = {"step": list(range(steps)), "sample": list(range(steps)), "reward": [0.5] * steps}
    return load_run(write_run(tmp_path / "run", tokens=tokens, samples=samples, rules=["ppo"]))


def _signals(steps: int, accuracy: dict[int, float] | None = None, reward: list[float] | None = None) -> pl.DataFrame:
    """step_signals: flat entropy and k3, the reward (0.5 unless given) and the evaluations."""
    accuracy = accuracy or {}
    columns = {
        "step": list(range(steps)),
        "entropy": [1.0] * steps,
        "k3_kl": [1e-3] * steps,
        "reward": reward or [0.5] * steps,
        "accuracy": [accuracy.get(s) for s in range(steps)],
    }
    return pl.DataFrame(columns, schema_overrides={"accuracy": pl.Float64}).with_columns(pl.col("step").cast(pl.Int32))


BINOMIAL = CollapseConfig(eval_size=N)


def _alerts(tmp_path, steps: int, config: CollapseConfig = BINOMIAL, **signals) -> list[tuple]:
    alerts = detect_collapse(_run(tmp_path, steps), config, signals=_signals(steps, **signals))
    return alerts.select("kind", "step", "end_step", "severity", "critical_step", "evidence_start_step").rows()


# 0.5 at steps 0–40, then 0.44, 0.40, 0.38 (an evaluation every 10 steps)
FALL = {0: 0.5, 10: 0.5, 20: 0.5, 30: 0.5, 40: 0.5, 50: 0.44, 60: 0.40, 70: 0.38}


def test_a_fall_is_critical_once_the_cusum_passes_its_alarm_at_an_evaluation_below_the_line(tmp_path):
    # baseline m = 0.5 (the median of the last 5 unflagged), SE5 = 0.02563, the line
    # m − max(3·SE5, 0.1·m) = 0.5 − 0.0769:
    #   50: 0.44 is 2.34 SE below: not below the line (it joins the baseline: median still 0.5);
    #       the CUSUM g = 2.34 − 0.5 = 1.84 > 0: an excursion begins at 50
    #   60: 0.40 is 3.90 SE below: below the line, and g = 1.84 + 3.40 = 5.24 > h = 5: critical;
    #       the fall began at 50 (g's last 0 at 40)
    assert _alerts(tmp_path / "h5", 80, accuracy=FALL) == [("accuracy_drop", 50, 70, "critical", 60, 50)]
    # without the CUSUM's alarm: the second evaluation below the line in a row (70: 0.38, 4.68 SE)
    late = CollapseConfig(eval_size=N, cusum_alarm=100.0)
    assert _alerts(tmp_path / "h100", 80, late, accuracy=FALL) == [("accuracy_drop", 50, 70, "critical", 70, 50)]


def test_accuracy_fall_step_by_step():
    fall = AccuracyFall(CollapseConfig(cusum_alarm=100.0), N)
    got = [fall.push(s, a) for s, a in FALL.items()]
    assert got[:6] == [None] * 6 and fall.cusum == pytest.approx((0.06 + 0.1 + 0.12) / SE5 - 3 * 0.5)
    assert got[6] == (False, 50, 0.5) and got[7] == (True, 50, 0.5)
    assert fall.began == 50  # where the stop keeps its checkpoint before
    fall.push(80, 0.52)  # back above the line after a confirmed fall: the CUSUM restarts
    assert fall.below == 0 and fall.cusum == 0 and fall.began is None
    # an evaluation below the line, not confirmed, then one above: the CUSUM remembers the fall
    assert fall.push(90, 0.4) == (False, 90, 0.5) and fall.push(100, 0.5) is None
    assert fall.below == 0 and fall.cusum == pytest.approx(0.1 / SE5 - 1.0) and fall.began == 90


def test_a_healthy_dip_and_a_slow_decline_are_not_a_fall(tmp_path):
    # the shipped healthy dppo_binary_tv run's evaluations: against the highest level, 0.44 (the
    # first evaluation alone), the dip to 0.37, 0.36, 0.36 is 2.0–2.3 standard errors
    # (√(0.44·0.56/500·(1 + π/2)) = 0.0356), not 3
    dip = [0.44, 0.42, 0.40, 0.42, 0.45, 0.42, 0.37, 0.36, 0.36, 0.45, 0.41, 0.46]
    assert _alerts(tmp_path / "dip", 120, accuracy={10 * i: a for i, a in enumerate(dip)}) == []
    # a slow decline, 0.5 to 0.4 over 40 evaluations with ±0.02 of noise: each evaluation is
    # at most 0.0625 below the highest level of the 10 evaluations before it (3 SE ≈ 0.077)
    slow = {10 * i: 0.5 - 0.0025 * i + (0.02 if i % 2 else -0.02) for i in range(41)}
    assert _alerts(tmp_path / "slow", 410, accuracy=slow) == []


def test_without_eval_size_an_evaluation_falls_by_a_quarter():
    # the relative line (1 − accuracy_drop)·m = 0.375 without the binomial noise: 0.44, 0.40 and
    # 0.38 are above it and join the reference (median 0.44 after them), but the baseline is still
    # the level 0.5 of the evaluations before them (within accuracy_memory), the line 0.375
    fall = AccuracyFall(CollapseConfig(), None)
    assert [fall.push(s, a) for s, a in FALL.items()] == [None] * 8
    assert [fall.push(s, a) for s, a in {80: 0.30, 90: 0.30}.items()] == [(False, 80, 0.5), (True, 80, 0.5)]


def test_a_fall_at_the_first_evaluations_is_judged_from_the_level_before_it():
    # a run that falls at its first evaluations and sits low (a collapse-preset cispo run): 0.436,
    # then 0.334 (0.102 below, under 3 SE of a one-evaluation baseline: √(0.436·0.564/500·(1 + π/2))
    # = 0.0356, so it joins the reference), then 0.31: 0.126 below the baseline 0.436, which is
    # still the highest level; the CUSUM g = (0.102 + 0.126)/0.0356 − 2·0.5 = 5.41 is past 5, so it
    # is critical at once, and the fall began at step 10 (a stop keeps step 0's weights)
    early = {0: 0.436, 10: 0.334, 20: 0.31, 30: 0.30}
    fall = AccuracyFall(CollapseConfig(), N)
    assert [fall.push(s, a) for s, a in early.items()][:3] == [None, None, (True, 10, 0.436)]
    # 0.30 too is below the line: the CUSUM has grown by its 0.136
    assert fall.cusum == pytest.approx(0.364 / math.sqrt(0.436 * 0.564 / N * (1 + math.pi / 2)) - 1.5)
    # a baseline that is only the latest level follows the fall down: nothing is below its line
    follows = AccuracyFall(CollapseConfig(accuracy_memory=1), N)
    assert [follows.push(s, a) for s, a in early.items()] == [None] * 4


def test_eval_size_from_run_json():
    assert eval_size({"eval_size": 256}) == 256 and eval_size({"config": {"eval_size": 500}}) == 500
    assert eval_size({}) is None and eval_size({"eval_size": True}) is None and eval_size(None) is None


# 10 reward values a step of 16 0/1 samples takes: median 0.3125, MAD 0.0625 (robust s = 0.0927),
# standard deviation √((4·0.0625² + 2·0.25²)/10) = 0.1186
PATTERN = [0.3125] * 4 + [0.25, 0.375] * 2 + [0.0625, 0.5625]


def test_a_reward_dip_within_its_standard_error_is_a_warning(tmp_path):
    # 120 baseline steps (m = 0.3125 throughout), then 5 steps at 0: x̄ = 0 at steps 121–125
    # (|z| = 0.3125/0.0927 = 3.4), a warning from 121. The lowest r̄ (the last 10 steps) is 0.15:
    # below 0.56·m = 0.175, and 0.1625 below m, more than 5·0.0927/√10 = 0.147 (the MAD's standard
    # error, critical before) but less than 5 standard errors of the baseline's spread, ≥ 0.1186/√10:
    # a warning
    reward = PATTERN * 12 + [0.0] * 5 + PATTERN * 3
    assert [a[:5] for a in _alerts(tmp_path / "dip", len(reward), reward=reward)] == [
        ("reward_drop", 121, 125, "warning", None)
    ]
    # 10 steps at 0: r̄ = 0 is 0.3125 below m, critical
    deep = PATTERN * 12 + [0.0] * 10 + PATTERN * 3
    assert [a[3] for a in _alerts(tmp_path / "deep", len(deep), reward=deep)] == ["critical"]
