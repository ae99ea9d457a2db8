"""A recorder with live alerts: the run keeps them (alerts table), on_alert and the mirror get them
off the training thread, and bad input or a failing callable or mirror never stops the recording."""

import threading
import time
import warnings

import polars as pl
import pytest
import torch

from trustlens import TokenRecorder, live_alerts, load_run
from trustlens.analysis import CollapseConfig, detect_collapse
from trustlens.export.sinks import WandbSink

B, T, STEPS = 8, 6, 40


def _record(rec, steps: int = STEPS, after=None) -> None:
    """Entropy 1 → 0.2 at step 25 and reward 1 → 0 at step 30: two critical alerts. `after(step)`
    runs after each step's end_step."""
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        mu = -torch.rand(B, T, generator=g) - 0.1
        rec.record(
            step,
            token_ids=torch.randint(0, 9, (B, T), generator=g),
            response_mask=torch.ones(B, T),
            pi_logp=mu,
            mu_logp=mu,
            advantages=torch.randn(B, generator=g),
            entropy=torch.full((B, T), 1.0 if step < 25 else 0.2),
        )
        rec.log_samples(step, rewards=[1.0 if step < 30 else 0.0] * B)
        rec.end_step(step)
        if after is not None:
            after(step)


class AlertSink:
    def __init__(self):
        self.alerts, self.counts = [], []

    def log_step(self, step, scalars):
        pass

    def log_live_alert(self, alert, counts, raised):
        self.alerts.append(alert)
        self.counts.append(dict(counts))

    def close(self):
        pass


def test_the_run_keeps_the_live_alerts_and_they_equal_the_offline_ones(tmp_path):
    calls, threads = [], set()

    def on_alert(alert):
        calls.append((alert.kind, alert.step, alert.severity))
        threads.add(threading.current_thread().name)

    sink = AlertSink()
    with TokenRecorder(tmp_path / "run", rules=["ppo"], alerts=True, on_alert=on_alert, mirror=sink) as rec:
        _record(rec)
    run = load_run(tmp_path / "run")
    assert run.manifest["planned_steps"] is None and run.manifest["config"] is None  # window: 15
    live = live_alerts(run)
    offline = detect_collapse(run)
    assert [(a.kind, a.step, a.severity, a.critical_step, a.end_step) for a in live] == offline.select(
        "kind", "step", "severity", "critical_step", "end_step"
    ).rows()
    assert [a.kind for a in live] == ["entropy_collapse", "reward_drop"]
    assert all(not a.provisional for a in live)
    rows = run.alerts.collect()
    # entropy's median of 3 is low from step 26: the third such step in a row, 28, raises it
    assert rows["raised_at_step"].min() == 28
    assert rows.sort("raised_at_step", "raised_wall_time")["raised_wall_time"].is_sorted()
    assert rows.filter(kind="reward_drop").select(
        "raised_at_step", "severity", "critical_step", "provisional"
    ).rows() == [
        (33, "warning", None, True),  # flagged from 31, raised at the third flagged step
        (34, "critical", 34, True),
        (39, "critical", 34, False),  # final when the run closed
    ]
    # on_alert and the mirror: each alert of warning or above once, and again when more severe
    assert calls == [(a.kind, a.step, a.severity) for a in sink.alerts]
    # (only an outcome is critical: the entropy fall warns)
    assert calls == [
        ("entropy_collapse", 26, "warning"),
        ("reward_drop", 31, "warning"),
        ("reward_drop", 31, "critical"),
    ]
    assert sink.counts[-1] == {"critical": 1, "warning": 2}
    assert threads == {"trustlens-alerts"}
    assert 0 < rec._live.cpu_s < time.process_time()  # the writer thread's CPU spent on the alerts


def _parts(run, table):
    folder = run / table / "rank=0"
    return sorted(p.name for p in folder.glob("part-*.parquet")) if folder.is_dir() else []


def _until(condition, what):
    """Wait (at most 60 s) for `condition()`, which only the writer thread can make true."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_with_alerts_each_step_is_written_at_its_end_and_an_alert_at_once(tmp_path):
    run = tmp_path / "run"
    seen = []
    # flush_seconds an hour: only the step's end and the alert make the writer write

    def written(step):
        n = [step + 1] * 2
        _until(lambda: [len(_parts(run, t)) for t in ("tokens", "samples")] == n, f"step {step} written")
        if step == 28:  # entropy's median of 3 is low from step 26, the third such step raises it
            _until(lambda: seen, "the alert raised")
            alerts = pl.read_parquet(run / "alerts" / "rank=0" / _parts(run, "alerts")[0])
            assert alerts.select("kind", "step", "severity").row(0) == ("entropy_collapse", 26, "warning")

    with TokenRecorder(run, rules=["ppo"], alerts=True, flush_seconds=3600, on_alert=seen.append) as rec:
        assert rec._writer.writer.flush_steps
        _record(rec, steps=29, after=written)
    assert load_run(run).manifest["flush"] == {"rows_per_file": 262_144, "flush_seconds": 3600.0, "flush_steps": True}


def test_without_alerts_rows_wait_for_flush_seconds_unless_flush_steps(tmp_path):
    with TokenRecorder(tmp_path / "default", rules=["ppo"]) as rec:
        assert not rec._writer.writer.flush_steps
    run = tmp_path / "run"
    with TokenRecorder(run, rules=["ppo"], flush_seconds=3600, flush_steps=True) as rec:
        _record(rec, steps=1)
        _until(lambda: _parts(run, "tokens") == ["part-000000.parquet"], "the step's rows written at its end")
    with pytest.raises(TypeError, match="flush_steps must be True or False"):
        TokenRecorder(tmp_path / "bad", flush_steps="yes")


def test_planned_steps_set_the_window(tmp_path):
    with TokenRecorder(tmp_path / "run", rules=["ppo"], alerts=CollapseConfig(), planned_steps=40) as rec:
        _record(rec)
    run = load_run(tmp_path / "run")
    assert run.manifest["planned_steps"] == 40
    live = [(a.kind, a.step, a.severity) for a in live_alerts(run)]
    assert live == detect_collapse(run).select("kind", "step", "severity").rows()


def test_a_failing_on_alert_is_warned_once_and_the_recording_goes_on(tmp_path):
    def on_alert(alert):
        raise RuntimeError("pager down")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with TokenRecorder(tmp_path / "run", rules=["ppo"], on_alert=on_alert) as rec:
            _record(rec)
    said = [str(w.message) for w in caught if "on_alert" in str(w.message)]
    assert len(said) == 1 and "RuntimeError: pager down" in said[0] and "recording go on" in said[0]
    run = load_run(tmp_path / "run")
    assert run.status == "finished" and len(live_alerts(run)) == 2


def test_a_mirror_that_is_down_is_one_line_and_the_alerts_go_on(tmp_path):
    class DownSink(AlertSink):
        def log_live_alert(self, alert, counts, raised):
            raise ConnectionError("wandb.ai unreachable")

    down = "mirror to .* failed and is switched off: wandb.ai unreachable"
    with (
        pytest.warns(UserWarning, match=down),
        TokenRecorder(tmp_path / "run", rules=["ppo"], alerts=True, mirror=DownSink()) as rec,
    ):
        _record(rec)
    assert len(live_alerts(load_run(tmp_path / "run"))) == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"on_alert": "print"}, "on_alert must be a callable taking one trustlens.live.LiveAlert .*got str 'print'"),
        ({"alerts": "yes"}, "alerts must be True, False or a CollapseConfig, got str 'yes'"),
    ],
)
def test_bad_alert_arguments_are_one_clear_line(tmp_path, kwargs, message):
    with pytest.raises(TypeError, match=message):
        TokenRecorder(tmp_path / "run", rules=["ppo"], **kwargs)
    assert not (tmp_path / "run" / "run.json").exists()  # refused before the run is opened


def test_the_wandb_sink_sends_an_alert_at_the_matching_level_and_a_table(tmp_path):
    wandb = pytest.importorskip("wandb")

    class FakeRun:
        def __init__(self):
            self.alerts, self.logged = [], []

        def alert(self, title, text, level):
            self.alerts.append((title, text, level))

        def log(self, data, **kwargs):
            self.logged.append((data, kwargs))

    fake = FakeRun()
    sink = WandbSink(run=fake)
    with TokenRecorder(tmp_path / "run", rules=["ppo"], alerts=True, mirror=sink) as rec:
        _record(rec)
    levels = [(title, level) for title, _, level in fake.alerts]
    assert levels == [
        ("trustlens warning: entropy_collapse", wandb.AlertLevel.WARN),
        ("trustlens warning: reward_drop", wandb.AlertLevel.WARN),
        ("trustlens critical: reward_drop", wandb.AlertLevel.ERROR),
    ]
    tables = [data["trustlens/alerts"] for data, _ in fake.logged if "trustlens/alerts" in data]
    assert len(tables) == 3 and len(tables[-1].data) == 3
    assert tables[-1].columns == ["step", "raised_at_step", "severity", "kind", "signal", "message"]


def test_tensorboard_gets_the_alert_text_and_counts(tmp_path):
    pytest.importorskip("tensorboardX")
    from tensorboard.backend.event_processing import event_accumulator

    with TokenRecorder(tmp_path / "run", rules=["ppo"], alerts=True, mirror=f"tensorboard:{tmp_path / 'tb'}") as rec:
        _record(rec)
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    counts = {tag: {e.step: e.value for e in acc.Scalars(f"trustlens/alerts/{tag}")} for tag in ("critical", "warning")}
    # one text per episode and one when it turns critical: counts at the steps they were raised at
    assert counts == {"critical": {34: 1.0}, "warning": {28: 1.0, 33: 2.0, 34: 2.0}}
    assert "trustlens/alerts/text_summary" in acc.Tags()["tensors"]
