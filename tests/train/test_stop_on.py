"""`trustlens train --stop-on`: a run whose engine writes sentinel log-probs (a doctor problem
from its first steps) stops, keeps the checkpoint from before the alert's first step and says
why in run.json; bad settings are refused naming them."""

from __future__ import annotations

import json

import pytest

from trustlens import live_alerts, load_run
from trustlens.cli import main
from trustlens.train.config import TrainConfig, config_from_preset
from trustlens.train.model import load_checkpoint
from trustlens.train.trainer import train


def test_a_run_stops_on_a_critical_alert_and_keeps_the_checkpoint_from_before_it(tmp_path):
    cfg = config_from_preset("quick", steps=8, eval_size=0, engine="sentinel", stop_on="critical", checkpoint_every=1)
    result = train(cfg, tmp_path / "run", progress=False)
    run = load_run(tmp_path / "run")
    why = run.manifest["stopped"]
    assert why == result.stopped
    alert = why["alert"]
    assert (why["on"], alert["kind"], alert["severity"]) == ("critical", "sentinel", "problem")
    # it stopped at the step the alert reached the trainer: the one that raised it or the next
    assert alert["raised_at_step"] <= why["step"] <= alert["raised_at_step"] + 2 < cfg.steps
    assert len(result.rewards) == why["step"] + 1 and run.status == "finished"
    kept = [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()]
    assert kept == [f"step-{alert['step']:06d}"] and why["checkpoint"] == f"checkpoints/{kept[0]}"
    meta = json.loads((tmp_path / "run" / why["checkpoint"] / "meta.json").read_text())
    assert meta == {"step": alert["step"], "before_update": True}
    load_checkpoint(tmp_path / "run" / why["checkpoint"])  # a warm start for --checkpoint
    raised = [a for a in live_alerts(run) if a.kind == "sentinel"]
    assert raised[0].severity == "problem" and raised[0].source == "doctor"


def test_without_stop_on_nothing_is_judged_or_kept(tmp_path):
    train(config_from_preset("quick", steps=2, eval_size=0), tmp_path / "run", progress=False)
    run = load_run(tmp_path / "run")
    assert run.manifest["stopped"] is None and not (tmp_path / "run" / "checkpoints").exists()
    assert live_alerts(run) == []


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [("stop_on", "critcal", ValueError), ("checkpoint_every", 0, ValueError), ("alerts", "yes", TypeError)],
)
def test_bad_settings_name_the_setting(field, value, error):
    with pytest.raises(error, match=field):
        TrainConfig(**{field: value})


def test_a_mistyped_stop_on_is_one_line_before_training(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--stop-on", "critcal", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert "argument --stop-on: must be one of critical, warning, never; got 'critcal'" in err
    assert "critical" in err.split("got 'critcal'")[1]  # the closest choice is named
    assert not (tmp_path / "r").exists()
