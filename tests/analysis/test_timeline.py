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
        # 500 problems an evaluation: 0.44, 0.35, 0.29, 0.36, 0.35, 0.22, against the baseline 0.436
        # (the highest level of the last 10 evaluations: the first, alone, se = 0.0356): 0.35 at
        # step 10 is 2.4 se below it (the CUSUM's excursion begins), 0.29 at 20 is below the line
        # with the CUSUM past its alarm, critical at 20; 0.36 at 30 is back above the line (the
        # fall ends, the CUSUM restarts); from 40 (0.35) the CUSUM grows again and 0.22 at 50 is
        # critical: two accuracy alerts, both before the collapse
        (10, "first signal", "accuracy_drop", "critical"),
        (40, "then", "accuracy_drop", "critical"),
        (86, "then", "reward_drop", "critical"),
        (100, "collapse", "accuracy", "collapse"),
        (118, "then", "reward_drop", "critical"),
    ]
    assert alerts["critical_step"].to_list() == [20, 50, 88, 120]
    assert alerts["evidence_start_step"].to_list() == [10, 40, 86, 118]
    # every alert once, pointing at its row of the alerts table
    rows = timeline.filter(pl.col("alert").is_not_null())
    assert sorted(rows["alert"].to_list()) == list(range(alerts.height))
    assert all(alerts["step"][r["alert"]] == r["step"] for r in rows.iter_rows(named=True))


def test_a_run_without_alerts_or_collapse_has_an_empty_timeline():
    run = load_run(SAMPLE / "learning")
    timeline = run_timeline(run, detect_collapse(run))
    assert timeline.is_empty() and timeline.columns == ["step", "event", "kind", "severity", "message", "alert"]
