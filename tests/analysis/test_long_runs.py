"""The collapse detectors on long runs (trustlens.analysis.collapse.steps): a warm-up, a slow
healthy drift, a zero baseline and a long fall, each a regression of main bea0ccc's detectors."""

import polars as pl

from trustlens.analysis import CollapseConfig, detect_collapse
from trustlens.analysis.collapse import CollapseSteps, warmup_steps
from trustlens.run import load_run
from trustlens.run.tables import write_run
from trustlens.synthetic import Drift, write_synthetic_run


def _one_token_run(path, steps: int, manifest_warmup: int | None = None):
    tokens = {"step": list(range(steps)), "sample": list(range(steps)), "pos": [0] * steps}
    tokens |= {"mu_logp": [-0.5] * steps, "pi_logp": [-0.5] * steps, "advantage": [-1.0] * steps}
    config = None if manifest_warmup is None else {"warmup_steps": manifest_warmup}
    return load_run(write_run(path, tokens=tokens, rules=["ppo"], config=config))


def _signals(steps: int, **columns) -> pl.DataFrame:
    return pl.DataFrame({"step": list(range(steps)), **columns}).with_columns(pl.col("step").cast(pl.Int32))


def test_a_warm_up_that_blocks_nothing_is_not_the_baseline(tmp_path):
    # the rule blocks nothing for 50 warm-up steps, then 2 % (bea0ccc: a critical blocked_drift, 0 → 2 %)
    steps = 300
    blocked = [0.0] * 50 + [0.02 + 0.002 * ((s * 7) % 5 - 2) / 2 for s in range(50, steps)]
    signals = _signals(steps, blocked_ppo=blocked)
    run = _one_token_run(tmp_path / "w", steps, manifest_warmup=50)
    assert warmup_steps(run.manifest) == 50
    assert detect_collapse(run, signals=signals, rule="ppo").is_empty()
    # without the warm-up named, a zero baseline is still never the base of a factor: m floored at
    # blocked_drift (1 %): 2 % is not 2× of it, and the trailing baseline takes the new level in
    unnamed = _one_token_run(tmp_path / "u", steps)
    assert detect_collapse(unnamed, signals=signals, rule="ppo").filter(pl.col("severity") == "critical").is_empty()


def test_a_slow_healthy_drift_raises_nothing(tmp_path):
    # k3 doubles and entropy falls 40 % over 3,000 steps, with noise (bea0ccc: 8 mismatch warnings)
    steps = 3000
    noise = [1 + 0.1 * (((s * 37) % 11) - 5) / 5 for s in range(steps)]
    k3 = [2e-3 * 2 ** (s / steps) * n for s, n in zip(range(steps), noise, strict=True)]
    entropy = [1.0 * (1 - 0.4 * s / steps) * n for s, n in zip(range(steps), noise, strict=True)]
    run = _one_token_run(tmp_path / "d", 40)
    assert detect_collapse(run, signals=_signals(steps, k3_kl=k3, entropy=entropy)).is_empty()


def test_the_evaluations_of_one_fall_are_one_alert(tmp_path):
    # an evaluation every 25 steps, a merge gap of 5: accuracy falls at step 100 and stays down
    # (bea0ccc: a new accuracy_drop alert at every evaluation after the fall)
    steps = 400
    accuracy = [None] * steps
    for s in range(0, steps, 25):
        accuracy[s] = 0.45 if s < 100 else 0.1
    run = _one_token_run(tmp_path / "a", 40)
    alerts = detect_collapse(run, signals=_signals(steps, accuracy=accuracy))
    assert alerts.select("kind", "step", "end_step", "severity", "critical_step").rows() == [
        ("accuracy_drop", 100, 375, "critical", 125)
    ]


def test_the_fall_after_learning_is_measured_from_the_peak(tmp_path):
    # accuracy rises 0.3 → 0.5 and falls back to 0.3: a fall of 40 % from what the run reached
    accuracy = [None] * 200
    for i, a in enumerate([0.3, 0.35, 0.4, 0.45, 0.5, 0.5, 0.5, 0.3, 0.3, 0.3]):
        accuracy[20 * i] = a
    run = _one_token_run(tmp_path / "p", 40)
    alerts = detect_collapse(run, signals=_signals(200, accuracy=accuracy))
    assert alerts.select("step", "severity", "critical_step", "baseline").rows() == [(140, "critical", 160, 0.5)]


def test_a_critical_alert_carries_the_warnings_before_it(tmp_path):
    # the mismatch grows from step 40, the reward falls from step 60: the reward's critical alert
    # lists mismatch_growth as evidence, from its first flagged step
    steps = 120
    k3 = [2e-3] * 40 + [1e-2] * 80
    reward = [0.5] * 60 + [0.1] * 60
    run = _one_token_run(tmp_path / "e", 40)
    alerts = detect_collapse(run, signals=_signals(steps, k3_kl=k3, reward=reward))
    drop = alerts.filter(kind="reward_drop").row(0, named=True)
    assert drop["severity"] == "critical"
    # (the mismatch's median of 9 steps is high from step 44)
    assert (drop["evidence"], drop["evidence_start_step"]) == (["mismatch_growth"], 44)
    assert "after mismatch_growth from step 44" in drop["message"]


def test_state_stays_bounded_on_a_long_run():
    cfg = CollapseConfig()
    steps = CollapseSteps(cfg, ["step", "k3_kl", "entropy", "reward"], None, 0, "dense", 15, keep=False)
    for s in range(2000):
        steps.push(s, {"k3_kl": 1e-3 * (1 + (s % 7) / 10), "entropy": 1.0, "reward": 0.5})
        steps.closed()
    assert all(len(j.reference) <= cfg.reference_steps for j in steps.judges)
    assert len(steps.open) <= len(steps.judges) and len(steps.warnings) <= 2000


def test_a_synthetic_long_run_with_drift(tmp_path):
    drift = Drift(warmup_steps=30, eval_every=20)
    common = dict(steps=400, samples_per_step=16, seq_len=8, group_size=8, rules=["ppo"], active_rule="ppo")
    healthy = load_run(write_synthetic_run(tmp_path / "h", drift=drift, **common))
    assert healthy.manifest["warmup_steps"] == 30 and healthy.manifest["config"]["drift"]["eval_every"] == 20
    # no critical alert; at most one warning (a few heavy-tailed k3 steps of 128 tokens)
    alerts = detect_collapse(healthy)
    assert alerts.filter(pl.col("severity") == "critical").is_empty()
    assert alerts.filter(pl.col("severity") == "warning").height <= 1
    collapsing = load_run(write_synthetic_run(tmp_path / "c", drift=drift, collapse_at=300, **common))
    critical = detect_collapse(collapsing).filter(pl.col("severity") == "critical")
    assert critical.height >= 1 and 300 <= critical["critical_step"].min() < 320
