"""`trustlens watch LOGDIR` on a TensorBoard log dir being written: new event records only, and
the alerts `trustlens import` finds on the finished dir (issue 51, point 4)."""

import io
import json

from ingest.logs import verl_steps, write_verl_tensorboard

from trustlens import load_run
from trustlens.analysis.collapse import detect_collapse
from trustlens.ingest import import_log
from trustlens.ingest.follow import EventFollower, is_event_dir
from trustlens.ingest.watch import watch
from trustlens.live import LiveMonitor

KEY = ("kind", "signal", "step", "end_step", "severity", "critical_step")


def _imported(folder, tmp_path, key=KEY) -> set[tuple]:
    import_log(folder, tmp_path / "imported", overwrite=True)
    alerts = detect_collapse(load_run(tmp_path / "imported"))
    return {tuple(row[k] for k in key) for row in alerts.iter_rows(named=True)}


def test_a_log_followed_while_written_gets_the_alerts_of_the_finished_dir(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    steps = verl_steps(120, filler=False)
    folder = tmp_path / "tb"
    writer = SummaryWriter(str(folder))  # verl's _TensorboardAdapter
    follower = EventFollower(folder)
    monitor = None
    seen: list[int] = []
    for n, (step, data) in enumerate(steps):
        for key in data:
            writer.add_scalar(key, data[key], step)
        if n % 25 == 24:  # a poll now and then, while the writer goes on
            writer.flush()
            done = follower.poll()
            for s, rows in done:
                monitor = monitor or LiveMonitor(follower.manifest, doctor=None)
                monitor.update(s, metrics=rows)
                seen.append(s)
            assert all(r.offset == r.path.stat().st_size for r in follower._files.values())  # read to the end
            assert not follower.poll()  # nothing new: no step handed out twice
    writer.close()
    for s, rows in follower.poll(finish=True):
        monitor.update(s, metrics=rows)
        seen.append(s)
    monitor.finish()
    assert seen == [s for s, _ in steps]
    assert follower.framework == "verl"
    live = {tuple(getattr(a, k) if k != "end_step" else a.end_step for k in KEY) for a in monitor.alerts}
    assert live == _imported(folder, tmp_path) and len(live) == 6


def test_watch_prints_each_alert_and_ends_when_the_log_stops(tmp_path):
    folder = write_verl_tensorboard(tmp_path / "tb", verl_steps(120, filler=False))
    (tmp_path / "empty").mkdir()
    assert is_event_dir(folder) and not is_event_dir(tmp_path / "empty")
    out = io.StringIO()
    assert watch(folder, as_json=True, stale=0.3, every=0.05, out=out) == 0
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    final = {}
    for e in events[:-1]:
        final[(e["kind"], e["signal"], e["step"])] = e
    # each alert is printed when raised and when its severity changes: its last line has its severity
    key = ("kind", "signal", "step", "severity")
    got = {tuple(e[k] for k in key) for e in final.values()}
    assert got == _imported(folder, tmp_path, key) and len(got) == 6
    assert events[-1]["event"] == "end" and "taken as finished" in events[-1]["message"]
