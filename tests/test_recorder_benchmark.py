"""benchmarks/recorder.py runs end to end on a tiny budget (a subprocess, as CleanRL tests its
scripts) and reports both kinds of paced rounds; its numbers are not asserted (no timings)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_recorder_benchmark_runs_on_a_tiny_budget():
    tiny = ["--rows", "20000", "--batch", "4", "--seq", "64", "--rounds", "1"]
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "recorder.py"), *tiny],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    assert "recorder benchmark: 20,000 token rows, 8 rules" in out
    assert " fresh inputs:" in out and " cold inputs:" in out
    assert out.count("median of 1 rounds") == 2 and "median of 1 rounds (goal ≤ 5%)" in out
