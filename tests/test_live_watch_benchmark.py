"""benchmarks/live_watch.py on a tiny budget: a 50-step run followed step by step, its collapse
alerted in the measured steps."""

from benchmark_scripts import load


def test_one_run_followed_step_by_step(tmp_path):
    bench = load("live_watch")
    row = bench.measure(tmp_path, 50, samples=8, seq_len=8, last=20, doctor=False)
    assert row["steps"] == 50 and row["alerts"] > 0  # the collapse 40 steps before the end is alerted
    assert row["median_ms"] > 0 and row["mean_ms"] > 0
    assert row["rss_early_mb"] > 0 and row["rss_end_mb"] > 0


def test_the_latency_of_a_live_alert_to_watch_json(tmp_path):
    import os

    bench = load("live_watch")
    r = bench.latency(str(tmp_path / "run"), tmp_path, steps=30, pause=0.3, every=0.2, env=dict(os.environ))
    assert r["exit"] == 0  # watch followed the run to its end
    assert tuple(r["printed"][0][:3]) == ("entropy_collapse", "warning", 28)
    assert all(seconds > 0 for *_, seconds in r["printed"]) and r["recorder"]
