"""benchmarks/live_watch.py on a tiny budget: a 50-step run followed step by step, its collapse
alerted in the measured steps."""

from benchmark_scripts import load


def test_one_run_followed_step_by_step(tmp_path):
    bench = load("live_watch")
    row = bench.measure(tmp_path, 50, samples=8, seq_len=8, last=20, doctor=False)
    assert row["steps"] == 50 and row["alerts"] > 0  # the collapse 40 steps before the end is alerted
    assert row["median_ms"] > 0 and row["mean_ms"] > 0
    assert row["rss_early_mb"] > 0 and row["rss_end_mb"] > 0
