"""The live monitor fed a recorded run step by step raises the alerts detect_collapse finds on the
finished run, from state bounded by the windows, and the doctor's findings once each."""

import math
from pathlib import Path

import pytest
from benchmark_scripts import load

from trustlens import load_run
from trustlens.analysis import CollapseConfig, detect_collapse, doctor
from trustlens.analysis.collapse.steps import planned_window
from trustlens.live import DoctorConfig, LiveMonitor, replay
from trustlens.run.tables import write_run

DATA = Path(__file__).resolve().parents[2] / "data" / "sample_run"


def _offline(run) -> list[dict]:
    return detect_collapse(run).sort("step", "kind", "signal").to_dicts()


def _online(monitor: LiveMonitor) -> list[dict]:
    rows = [a.record() for a in monitor.alerts if a.source == "collapse"]
    return sorted(rows, key=lambda r: (r["step"], r["kind"], r["signal"]))


def _same(offline: list[dict], online: list[dict]) -> None:
    assert len(online) == len(offline)
    for off, on in zip(offline, online, strict=True):
        for key, value in off.items():
            if isinstance(value, float):  # a step's mean summed in another order: equal to rounding
                assert on[key] == pytest.approx(value, rel=1e-9), key
            else:
                assert on[key] == value, key


@pytest.mark.parametrize(
    "name",
    ["pg_is", pytest.param("ppo", marks=pytest.mark.slow), pytest.param("dppo_binary_tv", marks=pytest.mark.slow)],
)
def test_a_shipped_run_replayed_live_gets_the_offline_alerts(name):
    run = load_run(DATA / name)
    monitor = LiveMonitor.for_run(run, doctor=None)
    changes = list(replay(run, monitor))
    assert len(changes) == len({s for s, _ in changes[:-1]}) + 1  # one update per step, then finish
    _same(_offline(run), _online(monitor))
    assert all(not a.provisional for a in monitor.alerts)  # the run ended: every alert final
    # bounded state: the trailing baselines and the windows are the configuration's
    detectors = monitor._detectors
    window = planned_window(run.manifest)
    assert all(len(judge.reference) <= CollapseConfig().reference_steps for judge in detectors.judges)
    assert all(len(judge.window.values) <= min(10, window) for judge in detectors.judges)
    assert detectors.open == {} and detectors.episodes == []  # a live monitor keeps only open episodes


def test_an_alert_is_raised_at_its_first_step_then_changed_then_final(tmp_path):
    """A reward of about 1 that falls to 0.3 at step 20 of 40 (window 5, m = 1.01): x̄ (median of
    3) is 0.3 from step 21, flagged; the third flagged row in a row (23) raises it (confirm_steps),
    where r̄ (mean of 5) is (1.01 + 4·0.3)/5 = 0.442 < 0.56·m: critical at once; flagged steps go
    on to the last: final when the run ends."""
    steps = 40
    tokens = {"step": list(range(steps)), "sample": list(range(steps)), "pos": [0] * steps, "pi_logp": [-1.0] * steps}
    reward = [1.0 + 0.01 * (s % 3) if s < 20 else 0.3 for s in range(steps)]
    samples = {"step": list(range(steps)), "sample": list(range(steps)), "reward": reward}
    run = load_run(write_run(tmp_path / "r", tokens=tokens, samples=samples, rules=["ppo"]))
    assert planned_window(run.manifest) == 5  # write_run plans the 40 steps it writes
    monitor = LiveMonitor.for_run(run, doctor=None)
    changes = [
        (step, a.kind, a.step, a.severity, a.provisional, a.critical_step)
        for step, new in replay(run, monitor)
        for a in new
    ]
    assert changes == [
        (23, "reward_drop", 21, "critical", True, 23),
        (39, "reward_drop", 21, "critical", False, 23),
    ]
    assert monitor.alerts[0].raised_at_step == 39 and monitor.alerts[0].end_step == 39
    _same(_offline(run), _online(monitor))


def test_the_window_is_the_planned_one_not_the_recorded_one(tmp_path):
    """A run stopped at step 60 of 250 planned keeps the window of 250 (15 steps), live and offline."""
    tokens = {"step": list(range(60)), "sample": list(range(60)), "pos": [0] * 60, "pi_logp": [-1.0] * 60}
    run = load_run(write_run(tmp_path / "r", tokens=tokens, config={"steps": 250}))
    assert planned_window(run.manifest) == 15
    assert planned_window({}) == 15
    assert planned_window({"planned_steps": 40, "config": {"steps": 250}}) == 5


def test_steps_must_come_in_order():
    monitor = LiveMonitor({"rules": {}}, doctor=None)
    monitor.update(3)
    with pytest.raises(ValueError, match="step must come after the last step judged \\(3\\), got 3"):
        monitor.update(3)
    with pytest.raises(TypeError, match="manifest"):
        LiveMonitor("run.json")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="collapse"):
        LiveMonitor({}, collapse={"smooth": 3})  # type: ignore[arg-type]


def test_the_reward_critical_window_is_judged_alike_live(tmp_path):
    cfg = CollapseConfig(baseline_steps=4, merge_gap=2, smooth=1, confirm_steps=1)
    steps = 16
    tokens = {"step": list(range(steps)), "sample": list(range(steps)), "pos": [0] * steps, "pi_logp": [-1.0] * steps}
    reward = [1.0, 1.1, 0.9, 1.0, 1.0, 0.2, 1.0, 1.0, 1.0, 1.0, 0.1, 0.1, 0.1, 1.0, 1.0, 1.0]
    samples = {"step": list(range(steps)), "sample": list(range(steps)), "reward": reward}
    run = load_run(write_run(tmp_path / "r", tokens=tokens, samples=samples))
    monitor = LiveMonitor.for_run(run, cfg, doctor=None)
    list(replay(run, monitor))
    offline = detect_collapse(run, cfg).sort("step", "kind", "signal").to_dicts()
    assert len(offline) >= 2  # two episodes: the merge gap split them
    _same(offline, _online(monitor))


bench = load("doctor_detection")


@pytest.mark.parametrize("defect", ["sentinel", "shifted", "token_ids", "raw_logprobs"])
def test_a_planted_defect_is_named_live_from_the_first_steps(tmp_path, defect):
    run = load_run(bench.write_planted(tmp_path / defect, defect, 1))
    check = bench.DEFECTS[defect]
    assert (doctor(run)[0].check, doctor(run)[0].verdict) == (check, "problem")
    monitor = LiveMonitor.for_run(run, None, doctor=DoctorConfig(early_steps=3))
    found = [(step, a) for step, new in replay(run, monitor) for a in new if a.kind == check]
    first_step = min(s for s, _ in found)
    assert first_step < 3  # decided within the early steps
    assert found[-1][1].severity == "problem"
    assert len({a.severity for _, a in found}) == len(found)  # raised once per verdict
    assert all(a.source == "doctor" and not a.provisional for _, a in found)


def test_a_clean_run_raises_no_finding(tmp_path):
    run = load_run(bench.write_planted(tmp_path / "clean", "clean", 1))
    monitor = LiveMonitor.for_run(run, None)
    assert [a for _, new in replay(run, monitor) for a in new] == []
    assert math.isfinite(len(monitor.alerts)) and monitor.alerts == []


def test_a_symptom_found_later_says_it_may_follow_from_an_early_cause(tmp_path):
    run = load_run(bench.write_planted(tmp_path / "shifted", "shifted", 1))
    monitor = LiveMonitor.for_run(run, None, doctor=DoctorConfig(early_steps=3, every=4))
    found = {(a.kind, a.severity): step for step, new in replay(run, monitor) for a in new}
    assert found[("shift", "problem")] == 0
    level = next(a for a in monitor.alerts if a.kind == "level")
    assert found[("level", "problem")] == 3  # the first accumulating step (the 4th)
    assert "(may follow from shift)" in level.message  # shift was decided at the early steps


def test_a_run_shorter_than_the_accumulating_checks_cadence_is_judged_when_it_ends(tmp_path):
    run = load_run(bench.write_planted(tmp_path / "shifted", "shifted", 1))
    monitor = LiveMonitor.for_run(run, None, doctor=DoctorConfig(early_steps=3, every=10_000))
    judged = list(replay(run, monitor))
    last_step, at_finish = judged[-1]
    assert not any(a.kind == "level" for _, new in judged[:-1] for a in new)  # never due while running
    level = next(a for a in at_finish if a.kind == "level")
    assert (level.severity, level.raised_at_step, level.step) == ("problem", last_step, last_step)
    assert monitor.finish() == []  # nothing new when asked again
