"""`trustlens train --stop-on`: the checkpoint kept is the last one whose held-out evaluation came
before the alert's evidence began (hand-made evaluations and alerts); a run whose engine starts
writing sentinel log-probs (a doctor warning) stops, exits 4, reads as `stopped`, keeps that
checkpoint and never holds more than --keep-checkpoints + 1; bad settings are refused naming them."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from trustlens import live_alerts, load_run
from trustlens.cli import main
from trustlens.core.argument_checks import EXIT_ALERT_STOP
from trustlens.live import LiveAlert
from trustlens.live.stop import evidence_start, kept_checkpoint
from trustlens.train import stopping, trainer
from trustlens.train.config import TrainConfig, config_from_preset
from trustlens.train.engine_defects import deliver
from trustlens.train.model import load_checkpoint
from trustlens.train.stopping import AlertStop, checkpoint_name
from trustlens.train.trainer import train
from trustlens.train.world import init_world


def _alert(kind: str, step: int, severity: str = "critical", provisional: bool = False) -> LiveAlert:
    return LiveAlert(
        kind=kind,
        step=step,
        severity=severity,
        message="",
        source="collapse",
        raised_at_step=step + 2,
        raised_wall_time=time.time(),
        provisional=provisional,
        end_step=step + 2,
        signal=kind,
    )


def test_the_kept_checkpoint_is_the_last_evaluated_one_before_the_evidence():
    taken = [0, 10, 20, 30, 40]
    # every checkpoint evaluated; accuracy fell at the evaluation of step 40: its weights are not kept
    drop = _alert("accuracy_drop", 40)
    assert evidence_start(drop) == 40
    assert kept_checkpoint(taken, {0, 10, 20, 30, 40}, evidence_start(drop)) == 30
    # evaluations every 20 steps, the mismatch flagged from step 37: 30 was never evaluated, 20 was
    growth = _alert("mismatch_growth", 37, "warning")
    assert kept_checkpoint(taken, {0, 20, 40}, evidence_start(growth)) == 20
    # evidence at a checkpoint's own step: that checkpoint's weights produced it
    assert kept_checkpoint(taken, {0, 20, 40}, 20) == 0
    # a run without evaluations: the last checkpoint before the evidence
    assert kept_checkpoint(taken, set(), 37) == 30
    # evidence from the first step: nothing before it (the warm start is)
    assert kept_checkpoint(taken, {0}, 0) is None and kept_checkpoint([], set(), 5) is None


class _Recorder:
    """What AlertStop reads of a TokenRecorder."""

    def __init__(self) -> None:
        self.live_alerts: list[LiveAlert] = []
        self.live_judged_step: int | None = None


def test_rolling_checkpoints_are_the_last_n_plus_the_one_a_stop_would_keep(tmp_path, monkeypatch):
    monkeypatch.setattr(
        "trustlens.train.model.save_checkpoint", lambda model, tok, folder, meta: folder.mkdir(parents=True)
    )
    stop = AlertStop("critical", every=1, keep=2, run_dir=tmp_path, world=init_world())
    recorder = _Recorder()
    on_disk = []
    for step in range(12):
        recorder.live_judged_step = step - 2 if step >= 2 else None  # the writer two steps behind
        if step == 6:  # a warning from step 3 that may still turn critical
            recorder.live_alerts.append(_alert("entropy_collapse", 3, "warning", provisional=True))
        if step == 10:  # ... closed, a warning for good: it cannot stop the run any more
            recorder.live_alerts.append(_alert("entropy_collapse", 3, "warning"))
        accuracy = 0.5 if step % 4 == 0 else None  # evaluated every 4 steps
        stop.checkpoint(step, None, None, recorder, accuracy)
        on_disk.append(sorted(p.name for p in (tmp_path / "checkpoints").iterdir()))
    # keep + 2 (an alert not raised yet, the next evaluation's) + 1 (the warning's)
    assert max(len(names) for names in on_disk) == 5
    assert on_disk[5] == [checkpoint_name(s) for s in (0, 4, 5)]  # 0: the kept one for evidence from 3 on
    # the open warning keeps 0; 4 is the last evaluated one, kept for a fall first seen at step 8
    assert on_disk[9] == [checkpoint_name(s) for s in (0, 4, 8, 9)]
    # closed, the warning may still be a later critical's evidence (CollapseConfig.evidence_rows): 0 stays;
    # 4 for an accuracy fall whose first evaluation below the line is 8's (judged, not confirmed yet)
    assert on_disk[11] == [checkpoint_name(s) for s in (0, 4, 8, 10, 11)]


def test_each_alert_that_may_stop_the_run_keeps_its_own_checkpoint(tmp_path, monkeypatch):
    # measured on late_collapse seed 2 (docs/alerts.md): a provisional doctor warning from step 24
    # and an accuracy fall from step 60 — only the checkpoint before the earliest (20) was kept,
    # and the stop on the fall, which needs the one before 60 (50), kept 20
    monkeypatch.setattr(
        "trustlens.train.model.save_checkpoint", lambda model, tok, folder, meta: folder.mkdir(parents=True)
    )
    stop = AlertStop("critical", every=1, keep=2, run_dir=tmp_path, world=init_world(), eval_size=500)
    recorder = _Recorder()
    recorder.live_alerts.append(_alert("level", 1, "warning", provisional=True))
    for step in range(12):
        recorder.live_judged_step = step - 2 if step >= 2 else None
        # 0.5, 0.5, then 0.44 at step 8: 2.0 standard errors below, the CUSUM's fall begins at 8
        accuracy = {0: 0.5, 4: 0.5, 8: 0.44}.get(step)
        stop.checkpoint(step, None, None, recorder, accuracy)
    assert stop.fall.began == 8
    # 0 for the warning from step 1, 4 for the fall from step 8, 8 for a fall first seen at the
    # next evaluation, and the last 2
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        checkpoint_name(s) for s in (0, 4, 8, 10, 11)
    ]


def test_bounded_keep_is_a_setting_named_when_bad():
    with pytest.raises(ValueError, match="keep_checkpoints"):
        TrainConfig(keep_checkpoints=0)
    with pytest.raises(ValueError, match="flush_seconds"):
        TrainConfig(flush_seconds=0)


def test_train_stops_exits_4_keeps_the_last_evaluated_weights_before_the_evidence(tmp_path, monkeypatch, capsys):
    # a clean engine until step 5, then sentinel log-probs: a doctor warning whose evidence starts there
    calls = itertools.count()
    monkeypatch.setattr(
        trainer, "deliver", lambda batch, engine, **kw: deliver(batch, "sentinel" if next(calls) >= 5 else engine, **kw)
    )
    held: list[int] = []
    checkpoint = AlertStop.checkpoint

    def counted(self, step, *args):
        checkpoint(self, step, *args)
        if self.folder is not None and self.folder.exists():
            held.append(len(list(self.folder.iterdir())))

    monkeypatch.setattr(stopping.AlertStop, "checkpoint", counted)
    out = tmp_path / "run"
    flags = ["--preset", "quick", "--steps", "14", "--eval-every", "3", "--eval-size", "8", "--checkpoint-every", "1"]
    code = main(["train", *flags, "--keep-checkpoints", "2", "--stop-on", "warning", "--quiet", "--out", str(out)])
    assert code == EXIT_ALERT_STOP == 4
    run = load_run(out)
    why = run.manifest["stopped"]
    assert run.status == "stopped" and run.manifest["error"] is None
    alert = why["alert"]
    start = why["evidence_start_step"]
    assert alert["severity"] == "warning" and start == alert["step"] and 5 <= start <= why["step"] < 14
    # evaluated at 0, 3, 6, ...: the last evaluated weights before the evidence, not later ones never evaluated
    expected = max(s for s in range(0, 14, 3) if s < start)
    assert why["checkpoint"] == f"checkpoints/{checkpoint_name(expected)}" and why["checkpoint_step"] == expected
    assert [p.name for p in (out / "checkpoints").iterdir()] == [checkpoint_name(expected)]
    accuracy = run.metrics.collect().filter(step=expected, name="eval/accuracy")["value"].item()
    assert why["checkpoint_accuracy"] == pytest.approx(accuracy)
    meta = json.loads((out / why["checkpoint"] / "meta.json").read_text())
    assert meta == {"step": expected, "before_update": True, "eval_accuracy": why["checkpoint_accuracy"]}
    load_checkpoint(out / why["checkpoint"])  # a warm start for --checkpoint
    assert held and max(held) <= 4  # --keep-checkpoints 2, plus the ones a stop would keep
    printed = capsys.readouterr().out
    assert f"(evidence from step {start}); kept {out}/{why['checkpoint']}" in printed


def test_evidence_from_the_first_step_keeps_no_checkpoint(tmp_path):
    cfg = config_from_preset("quick", steps=8, eval_size=0, engine="sentinel", stop_on="critical", checkpoint_every=1)
    result = train(cfg, tmp_path / "run", progress=False)
    run = load_run(tmp_path / "run")
    why = run.manifest["stopped"]
    assert why == result.stopped and run.status == "stopped" and result.stopped_step == why["step"]
    alert = why["alert"]
    assert (why["on"], alert["kind"], alert["severity"]) == ("critical", "sentinel", "problem")
    # it stopped at the step the alert reached the trainer: the one that raised it or the next
    assert alert["raised_at_step"] <= why["step"] <= alert["raised_at_step"] + 2 < cfg.steps
    assert len(result.rewards) == why["step"] + 1
    assert why["evidence_start_step"] == 0 and why["checkpoint"] is None
    assert list((tmp_path / "run" / "checkpoints").iterdir()) == []
    raised = [a for a in live_alerts(run) if a.kind == "sentinel"]
    assert raised[0].severity == "problem" and raised[0].source == "doctor"


def test_without_stop_on_nothing_is_judged_or_kept(tmp_path):
    train(config_from_preset("quick", steps=2, eval_size=0), tmp_path / "run", progress=False)
    run = load_run(tmp_path / "run")
    assert run.manifest["stopped"] is None and not (tmp_path / "run" / "checkpoints").exists()
    assert live_alerts(run) == [] and run.status == "finished"


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


def test_help_names_the_stop_exit_code(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "4 --stop-on stopped it" in " ".join(capsys.readouterr().out.split())
