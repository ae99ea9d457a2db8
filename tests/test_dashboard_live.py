"""The dashboard on a run still being written: the live line, a rerun by itself when new steps
arrive (keeping the page and the filters), a toast per new alert, and no polling of a closed run.
Through Streamlit's AppTest here; in Chromium with a run written by a background process in
tests/test_dashboard_live_browser.py."""

import fcntl
import json
import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from trustlens import dashboard
from trustlens.live import LiveAlert, alerts_batch
from trustlens.run import MANIFEST
from trustlens.run.parts import write_part
from trustlens.synthetic import write_synthetic_run

ENTRY = Path(__file__).resolve().parent.parent / "app" / dashboard.ENTRY


@pytest.fixture(scope="module")
def collapsing(tmp_path_factory) -> Path:
    """A collapsing run, one part file per table and step: grad_norm_spike from step 9,
    mismatch_growth from 10, entropy_collapse from 11, reward_drop from 13."""
    return write_synthetic_run(
        tmp_path_factory.mktemp("whole") / "run",
        steps=16,
        samples_per_step=16,
        seq_len=16,
        collapse_at=9,
        rows_per_part=1,
        seed=1,
    )


def copy_steps(source: Path, target: Path, steps: int, status: str = "running") -> None:
    """Make `target` the run `source` as it was after `steps` steps: its first `steps` part files
    of each table, and run.json with `status`."""
    for part in source.glob("*/rank=*/part-*.parquet"):
        if int(part.stem.split("-")[1]) < steps:
            copy = target / part.relative_to(source)
            copy.parent.mkdir(parents=True, exist_ok=True)
            if not copy.exists():
                shutil.copy(part, copy)
    manifest = json.loads((source / MANIFEST).read_text())
    (target / MANIFEST).write_text(json.dumps({**manifest, "status": status}))


def _app(monkeypatch, root: Path) -> AppTest:
    monkeypatch.setenv(dashboard.RUNS_ENV, str(root))
    return AppTest.from_file(str(ENTRY), default_timeout=120)


def _live_line(at: AppTest) -> str | None:
    found = [m.value for m in at.markdown if "live]" in m.value]
    return found[0] if found else None


def test_a_live_run_shows_its_step_reruns_into_new_steps_and_toasts_new_alerts(monkeypatch, tmp_path, collapsing):
    run = tmp_path / "live"
    copy_steps(collapsing, run, 10)
    at = _app(monkeypatch, tmp_path).run()
    assert not at.exception
    assert "step 9" in _live_line(at) and "updated" in _live_line(at)
    assert not at.toast  # alerts the run had when first shown are on the page, not toasted
    at.switch_page("views/collapse.py").run()
    at.sidebar.selectbox(key="tl_sign").set_value("pos").run()

    copy_steps(collapsing, run, 14)
    at.run()  # what the fragment's rerun does once the run changed in storage
    assert not at.exception
    assert "step 13" in _live_line(at)
    assert at.sidebar.selectbox(key="tl_sign").value == "pos"  # the filters stay
    assert at.sidebar.slider(key="tl_steps").value == (0, 13)  # the whole run, grown
    assert any(h.value == "Collapse signals" for h in at.title)  # the page stays
    toasts = [t.value for t in at.toast]
    assert any("entropy\\_collapse" in t and "step 11" in t for t in toasts), toasts
    # (the reward's fall at step 13 is not confirmed yet: confirm_steps flagged steps in a row)
    assert len(toasts) == len(set(toasts))  # each alert toasted once

    copy_steps(collapsing, run, 16, status="finished")
    at.run()
    assert _live_line(at) is None  # closed: no live line, no polling


def test_a_finished_run_is_not_followed(monkeypatch, tmp_path, collapsing):
    copy_steps(collapsing, tmp_path / "done", 16, status="finished")
    at = _app(monkeypatch, tmp_path).run()
    assert not at.exception
    assert _live_line(at) is None and not at.toast


def test_a_run_whose_writer_dies_shows_as_stopped_not_live(monkeypatch, tmp_path, collapsing):
    """A writer killed by SIGKILL leaves run.json saying running and its lock file unlocked: the
    test `trustlens watch` uses says stopped, and so does every page (no live line, no "still
    being written"), the Overview naming the run incomplete."""
    run = tmp_path / "killed"
    copy_steps(collapsing, run, 10)
    fd = os.open(run / ".rank=0.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the writer, alive
    try:
        at = _app(monkeypatch, tmp_path).run()
        assert not at.exception and "step 9" in _live_line(at)
    finally:
        os.close(fd)  # the writer dies: the kernel releases its lock
    at.run()  # the live check's rerun
    assert not at.exception
    assert _live_line(at) is None
    (line,) = [m.value for m in at.markdown if "stopped]" in m.value]
    assert "step 9 · stopped updating" in line and "no writer holds it" in line
    text = [i.value for i in at.info] + [w.value for w in at.warning]
    assert not any("still being written" in t for t in text), text
    assert any(t.startswith("This run is incomplete: it stopped updating") and "up to step 9" in t for t in text)
    assert any(t.value == "Overview" for t in at.title)


def test_an_interrupted_run_is_named_incomplete(monkeypatch, tmp_path, collapsing):
    copy_steps(collapsing, tmp_path / "stopped", 6, status="interrupted")
    at = _app(monkeypatch, tmp_path).run()
    assert not at.exception and _live_line(at) is None
    assert any(
        w.value.startswith("This run is incomplete: it ended interrupted") and "6 steps, up to step 5" in w.value
        for w in at.warning
    ), [w.value for w in at.warning]


def _live_alert(step: int, severity: str) -> pa.Table:
    alert = LiveAlert(
        kind="reward_drop",
        step=step,
        severity=severity,
        message="mean reward dropped <b>x</b>",
        source="collapse",
        raised_at_step=step,
        raised_wall_time=time.time(),
        provisional=True,
        end_step=step,
        signal="reward",
    )
    return pa.Table.from_batches([alerts_batch([alert])])


def test_a_run_that_keeps_its_live_alerts_toasts_those(monkeypatch, tmp_path, collapsing):
    run = tmp_path / "recorded"
    copy_steps(collapsing, run, 6)
    folder = run / "alerts" / "rank=0"
    write_part(_live_alert(3, "warning"), folder, 0)
    at = _app(monkeypatch, tmp_path).run()
    assert not at.exception and not at.toast
    copy_steps(collapsing, run, 7)
    write_part(_live_alert(3, "critical"), folder, 1)
    at.run()
    (toast,) = [t.value for t in at.toast]
    assert "critical alert** (raised live) at step 3" in toast and "reward\\_drop" in toast
    assert "<b>" not in toast  # the message is shown as text
