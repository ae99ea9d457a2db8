"""The verl and OpenRLHF drivers' live alerts, without the frameworks: the alerts so far go into
the trainer's own logged metrics as trustlens/alert/..., and TRUSTLENS_STOP_ON makes verl's next
step its last."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trustlens import TokenRecorder, load_run
from trustlens.integrations._ray_hooks import driver_alerts
from trustlens.integrations.verl.state import STATE
from trustlens.integrations.verl.stop import stop_if_due, stop_on_from_env
from trustlens.live import LiveAlert, alert_metrics


def _alert(kind, step, severity, raised_at_step, signal=None, source="collapse"):
    return LiveAlert(kind, step, severity, "m", source, raised_at_step, 0.0, True, step, signal=signal)


def test_alert_metrics_count_each_alert_at_its_latest_severity():
    alerts = [
        _alert("reward_drop", 5, "warning", 5, "reward"),
        _alert("entropy_collapse", 6, "info", 6, "entropy"),
        _alert("reward_drop", 5, "critical", 8, "reward"),  # the same alert, now critical
        _alert("sentinel", 1, "problem", 1, source="doctor"),
    ]
    assert alert_metrics(alerts) == {
        "trustlens/alert/warning": 0.0,
        "trustlens/alert/critical": 1.0,
        "trustlens/alert/problem": 1.0,
        "trustlens/alert/reward_drop": 2.0,
        "trustlens/alert/sentinel": 2.0,
    }
    assert alert_metrics([]) == {f"trustlens/alert/{s}": 0.0 for s in ("warning", "critical", "problem")}


def test_a_verl_driver_logs_the_alerts_and_stops_on_them(tmp_path, monkeypatch):
    """The driver (rank 0: samples and logged numbers, as verl's) of a run whose reward falls
    from about 1 to 0.3 at step 20."""
    monkeypatch.setenv("TRUSTLENS_STOP_ON", "critical")
    monkeypatch.setitem(STATE, "stopping", False)
    trainer = SimpleNamespace(total_training_steps=40, global_steps=0)
    rec = TokenRecorder(tmp_path / "run", rules=["ppo"], alerts=True, planned_steps=40)  # samples and metrics only
    logged = []
    for step in range(40):
        trainer.global_steps = step
        rec.log_samples(step, rewards=[1.0 + 0.01 * (step % 3) if step < 20 else 0.3] * 4)
        data = driver_alerts(rec, step, {"actor/grad_norm": 1.0})
        rec.flush()  # in a real run the writer judges while verl works; here: wait for it
        logged.append(data)
        stop_if_due(trainer, rec, step)
        if trainer.total_training_steps <= step:
            break
    rec.close()
    assert logged[0]["trustlens/alert/critical"] == 0.0 and logged[0]["actor/grad_norm"] == 1.0
    assert trainer.total_training_steps == 23  # critical at step 23 (tests/live: r̄ by hand)
    why = load_run(tmp_path / "run").manifest["stopped"]
    assert why["alert"]["kind"] == "reward_drop" and why["step"] == 23 and why["checkpoint"] is None


def test_a_mistyped_stop_on_names_the_variable(monkeypatch):
    monkeypatch.setenv("TRUSTLENS_STOP_ON", "critcal")
    with pytest.raises(ValueError, match="TRUSTLENS_STOP_ON must be one of critical, warning, never; got 'critcal'"):
        stop_on_from_env()
    monkeypatch.delenv("TRUSTLENS_STOP_ON")
    assert stop_on_from_env() == "never"
