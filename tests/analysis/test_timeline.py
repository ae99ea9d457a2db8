"""run_timeline: the shipped collapse's story in time order, and a learning run's notes."""

from pathlib import Path

import polars as pl

from trustlens.analysis import detect_collapse
from trustlens.analysis.collapse.timeline import run_timeline
from trustlens.run import load_run

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample_run"


def test_the_shipped_collapse_in_time_order():
    run = load_run(SAMPLE / "pg_is")
    alerts = detect_collapse(run)
    timeline = run_timeline(run, alerts)
    assert timeline.select("step", "event", "kind", "severity").rows() == [
        # 500 problems an evaluation: 0.44, 0.35, 0.29, 0.36, 0.35, 0.22: 0.29 at step 20 is below
        # the line alone (back above at 30: one evaluation raises nothing); 0.22 at 50 is below it
        # with the CUSUM of the fall past its alarm, critical at 50; the CUSUM has been > 0 since
        # step 10 (0.35, about 2.5 standard errors below 0.44), where the alert begins
        (10, "first signal", "accuracy_drop", "critical"),
        (86, "then", "reward_drop", "critical"),
        (100, "collapse", "accuracy", "collapse"),
        (118, "then", "reward_drop", "critical"),
    ]
    assert alerts["critical_step"].to_list() == [50, 88, 120]
    assert alerts["evidence_start_step"].to_list() == [10, 86, 118]
    # every alert once, pointing at its row of the alerts table
    rows = timeline.filter(pl.col("alert").is_not_null())
    assert sorted(rows["alert"].to_list()) == list(range(alerts.height))
    assert all(alerts["step"][r["alert"]] == r["step"] for r in rows.iter_rows(named=True))


def test_a_run_without_alerts_or_collapse_has_an_empty_timeline():
    run = load_run(SAMPLE / "learning")
    timeline = run_timeline(run, detect_collapse(run))
    assert timeline.is_empty() and timeline.columns == ["step", "event", "kind", "severity", "message", "alert"]
