"""`trustlens watch`: a run being written is followed to its end, each alert printed once (again
only when its severity changes), the alerts the finished run has; exit codes; the recorder's own
live alerts printed as such; each bad input one line."""

import io
import json
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from s3_server import BUCKET

from trustlens import Keep, cli, load_run
from trustlens.analysis.collapse import detect_collapse
from trustlens.core.argument_checks import EXIT_ALERT_STOP
from trustlens.live import LiveAlert, alerts_batch
from trustlens.live.stop import stopped_entry
from trustlens.live.watch import EXIT_CLOSED, EXIT_FAIL_ON, EXIT_STOPPED, Printer, watch
from trustlens.run import MANIFEST
from trustlens.run.manifest import new_manifest
from trustlens.run.tables import rule_entries
from trustlens.run.writer import RankWriter
from trustlens.synthetic import write_synthetic_run

# a synthetic run written one step every PAUSE seconds by another process, collapsing at step 15
WRITER = """
import sys, time
from trustlens.synthetic import write_synthetic_run
write_synthetic_run(sys.argv[1], steps=30, samples_per_step=16, seq_len=16, collapse_at=15, seed=1,
                    rows_per_part=1, on_step=lambda step: time.sleep(0.15))
"""


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trustlens.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _started(run, writer) -> None:
    deadline = time.monotonic() + 60
    while not (run / "tokens" / "rank=0" / "part-000001.parquet").exists():
        assert writer.poll() is None and time.monotonic() < deadline, writer.stderr.read()
        time.sleep(0.05)


def test_watch_follows_a_run_written_by_another_process_and_prints_each_alert_once(tmp_path):
    run = tmp_path / "run"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(run)], stderr=subprocess.PIPE, text=True)
    try:
        _started(run, writer)
        watcher = _cli("watch", str(run), "--json", "--every", "0.2")
        out, err = watcher.communicate(timeout=300)
    finally:
        writer.wait(timeout=120)
    assert watcher.returncode == EXIT_CLOSED, err
    lines = [json.loads(line) for line in out.splitlines()]
    alerts, end = lines[:-1], lines[-1]
    assert end["event"] == "end" and end["status"] == "finished" and end["exit"] == 0
    printed = [(a["kind"], a["signal"], a["step"], a["severity"]) for a in alerts]
    assert len(printed) == len(set(printed))  # each alert once per severity it reached
    assert all(a["event"] == "alert" and not a["live"] for a in alerts)
    last = {(a["kind"], a["signal"], a["step"]): a["severity"] for a in alerts}  # as last printed
    offline = detect_collapse(load_run(run))
    assert last == {(r["kind"], r["signal"], r["step"]): r["severity"] for r in offline.iter_rows(named=True)}
    # (30 steps, a collapse at 15: its signals warn; the reward's 5-step r̄ is too short to confirm it)
    assert any(severity in ("warning", "critical") for severity in last.values())


def _writer(path, **manifest_fields):
    manifest = new_manifest(rules=rule_entries(["ppo"]), active_rule="ppo", config={}, world_size=1)
    manifest.update(manifest_fields)
    return RankWriter(path, rank=0, world_size=1, rules=["ppo"], manifest=manifest, rows_per_file=10**6)


def _tokens(step, n=4):
    return pa.table(
        {
            "step": pa.array([step] * n, pa.int32()),
            "update": pa.array([0] * n, pa.int16()),
            "sample": pa.array([step] * n, pa.int64()),
            "group": pa.array([step] * n, pa.int64()),
            "pos": pa.array(range(n), pa.int32()),
            "token_id": pa.array([1] * n, pa.int32()),
            "pi_logp": pa.array([-0.5] * n, pa.float32()),
            "entropy": pa.array([1.0] * n, pa.float32()),
        }
    )


def _alert(step, severity, raised_at):
    return LiveAlert(
        kind="entropy_collapse",
        step=step,
        severity=severity,
        message="mean entropy fell\x1b[2J",  # an escape sequence must not reach the terminal
        source="collapse",
        raised_at_step=raised_at,
        raised_wall_time=time.time(),
        provisional=True,
        end_step=raised_at,
        signal="entropy",
    )


class _Steps:
    """A `sleep` for `watch` that writes the next of `actions` instead of waiting."""

    def __init__(self, *actions):
        self.actions = list(actions)

    def __call__(self, seconds):
        assert self.actions, "watch kept polling after the run closed"
        self.actions.pop(0)()


def test_the_recorders_live_alerts_are_printed_marked_live_once_per_severity(tmp_path):
    w = _writer(tmp_path / "run")
    out = io.StringIO()

    def step(n, *alerts):
        def act():
            w.append("tokens", _tokens(n))
            if alerts:
                w.append("alerts", alerts_batch(alerts))
            w.write_all()

        return act

    first = _alert(2, "warning", 2)
    actions = _Steps(
        step(0),
        step(1),
        step(2, first),
        step(3, first.changed(raised_at_step=3)),
        step(4, first.changed(severity="critical")),
        w.close,
    )
    assert watch(tmp_path / "run", every=0.01, out=out, sleep=actions) == EXIT_CLOSED
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("step      2  WARNING  entropy_collapse") and lines[0].endswith("(live)")
    assert "\x1b" not in out.getvalue() and "\\u001b[2J" in lines[0]  # shown, not acted on
    assert lines[1].startswith("step      2  CRITICAL entropy_collapse") and lines[1].endswith("(live)")
    assert lines[2] == f"run {str(tmp_path / 'run')!r} finished: 1 alert (1 critical)"
    assert len(lines) == 3


def test_fail_on_exits_1_at_the_first_alert_that_reaches_it(tmp_path):
    w = _writer(tmp_path / "run")
    out = io.StringIO()

    def step(n, *alerts):
        def act():
            w.append("tokens", _tokens(n))
            w.append("alerts", alerts_batch(alerts))
            w.write_all()

        return act

    actions = _Steps(step(0, _alert(0, "warning", 0)), step(1, _alert(0, "critical", 1)), w.close)
    code = watch(tmp_path / "run", fail_on="critical", out=out, sleep=actions)
    assert code == EXIT_FAIL_ON
    assert out.getvalue().splitlines()[-1] == f"run {str(tmp_path / 'run')!r}: an alert reached --fail-on critical"
    assert actions.actions == [w.close]  # it stopped at the critical alert, before the run closed
    w.close()


def test_a_run_its_trainer_stopped_on_an_alert_reads_as_stopped_not_finished_nor_killed(tmp_path):
    w = _writer(tmp_path / "run")
    out = io.StringIO()
    alert = _alert(2, "critical", 3)
    why = stopped_entry("critical", alert, 3, "checkpoints/step-000001", checkpoint_step=1, checkpoint_accuracy=0.5)

    def stop():
        w.update_manifest({"stopped": why})
        w.close()

    actions = _Steps(lambda: (w.append("tokens", _tokens(0)), w.write_all()), stop)
    assert watch(tmp_path / "run", every=0.01, out=out, sleep=actions) == EXIT_ALERT_STOP == 4
    assert load_run(tmp_path / "run").status == "stopped"
    assert out.getvalue().splitlines()[-1] == (
        f"run {str(tmp_path / 'run')!r} stopped after step 3 (--stop-on critical) on a critical entropy_collapse "
        "(evidence from step 2); kept checkpoints/step-000001 (held-out accuracy 0.500): 0 alerts (0 critical)"
    )


def test_a_writer_that_died_is_said_once_with_how_long_ago(tmp_path):
    # what a killed writer leaves: its rows, run.json saying running, and no lock held
    run = write_synthetic_run(tmp_path / "run", steps=3, samples_per_step=8, seq_len=4, status="running")
    out = io.StringIO()
    assert watch(run, out=out, sleep=_Steps()) == EXIT_STOPPED
    (line,) = out.getvalue().splitlines()
    assert "stopped updating" in line and " s ago" in line and "no writer holds it" in line


def test_a_run_on_an_object_store_that_stops_changing_is_stopped_after_stale_seconds(s3):
    url = f"s3://{BUCKET}/runs/quiet"
    w = _writer(url)
    w.append("tokens", _tokens(0))
    w.write_all()
    w.update_manifest({})  # `updated` now
    old = (datetime.now(timezone.utc) - timedelta(seconds=120)).isoformat(timespec="seconds")
    w.manifest["updated"] = old
    from trustlens.run.manifest import write_json_atomic

    write_json_atomic(w.path / "run.json", w.manifest)
    out = io.StringIO()
    assert watch(url, stale=60, out=out, sleep=_Steps()) == EXIT_STOPPED
    assert "stopped updating 12" in out.getvalue() and "nothing changed for over 60 s" in out.getvalue()


def test_the_status_line_is_rewritten_in_place_on_a_terminal():
    status = io.StringIO()
    printer = Printer(io.StringIO(), status, as_json=False, fail_on=None)
    printer.show_status("step 3 · 12 tokens")
    printer.alerts([_alert(2, "warning", 2)])
    assert status.getvalue() == "\r\x1b[Kstep 3 · 12 tokens\r\x1b[K"  # cleared before the alert
    quiet = io.StringIO()
    Printer(io.StringIO(), quiet, as_json=True, fail_on=None).show_status("step 3")
    assert quiet.getvalue() == ""  # no status line with --json


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("", "is not a trustlens run: it has no run.json"),
        ("nothing", "is not a trustlens run: no such file or directory"),
        ("done", "is already finished (last written "),
    ],
)
def test_a_non_run_or_a_finished_run_is_one_line(tmp_path, capsys, where, message):
    write_synthetic_run(tmp_path / "done", steps=2, samples_per_step=8, seq_len=4)
    assert cli.main(["watch", str(tmp_path / where)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("trustlens watch: error: ") and message in line


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--fail-on", "critcal"],
            "argument --fail-on: must be one of warning, critical; got 'critcal' (did you mean 'critical'?)",
        ),
        (["--every", "-1"], "argument --every: expected a number of seconds > 0, got '-1'"),
        (["--stale", "soon"], "argument --stale: expected a number of seconds > 0, got 'soon'"),
    ],
)
def test_a_bad_flag_is_argparses_one_line(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["watch", str(tmp_path), *flags])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err.splitlines()[-1]


def _publish(source, target, step):
    """Make step `step`'s part files of `source` (one per table, rank and step) appear in `target`."""
    for part in source.glob(f"*/rank=*/part-{step:06d}.parquet"):
        copy = target / part.relative_to(source)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(part, copy)


def test_a_sampled_two_rank_run_published_step_by_step_gets_the_finished_runs_alerts(tmp_path):
    source = write_synthetic_run(
        tmp_path / "source",
        steps=24,
        samples_per_step=16,
        seq_len=16,
        collapse_at=14,
        world_size=2,
        keep=Keep(rate=0.2, seed=0),
        rows_per_part=1,
        seed=2,
    )
    live = tmp_path / "live"
    live.mkdir()
    manifest = json.loads((source / MANIFEST).read_text())
    (live / MANIFEST).write_text(json.dumps({**manifest, "status": "running"}))
    steps = [lambda s=s: _publish(source, live, s) for s in range(24)]
    steps.append(lambda: (live / MANIFEST).write_text((source / MANIFEST).read_text()))
    out = io.StringIO()
    # the run has no writer lock: `writer_alive` cannot tell, and `updated` is recent
    assert watch(live, as_json=True, out=out, sleep=_Steps(*steps)) == EXIT_CLOSED
    alerts = [json.loads(line) for line in out.getvalue().splitlines()[:-1]]
    last = {(a["kind"], a["signal"], a["step"]): a["severity"] for a in alerts}
    offline = detect_collapse(load_run(source))
    assert last == {(r["kind"], r["signal"], r["step"]): r["severity"] for r in offline.iter_rows(named=True)}
    assert last


def test_doctor_findings_are_printed_once_each_with_doctor_and_not_without(tmp_path):
    source = write_synthetic_run(
        tmp_path / "source", steps=20, samples_per_step=16, seq_len=16, collapse_at=12, rows_per_part=1, seed=1
    )
    printed = {}
    for doctor in (False, True):
        live = tmp_path / f"live-{doctor}"
        live.mkdir()
        manifest = json.loads((source / MANIFEST).read_text())
        (live / MANIFEST).write_text(json.dumps({**manifest, "status": "running"}))
        steps = [lambda s=s, live=live: _publish(source, live, s) for s in range(20)]
        steps.append(lambda live=live: (live / MANIFEST).write_text((source / MANIFEST).read_text()))
        out = io.StringIO()
        assert watch(live, doctor=doctor, as_json=True, out=out, sleep=_Steps(*steps)) == EXIT_CLOSED
        printed[doctor] = [json.loads(line) for line in out.getvalue().splitlines()]
    findings = [e for e in printed[True] if e["event"] == "finding"]
    assert findings and all(e["source"] == "doctor" for e in findings)
    assert len({(e["kind"], e["severity"]) for e in findings}) == len(findings)  # once per verdict
    assert not any(e["event"] == "finding" for e in printed[False])
    assert "finding" in printed[True][-1]["message"]  # the end line counts them
