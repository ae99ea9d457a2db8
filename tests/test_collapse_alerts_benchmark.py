"""benchmarks/collapse_alerts.py: the per-run listing and the per-set lines, on a synthetic
collapse beside a healthy run, and on the shipped sample runs."""

from pathlib import Path

import pytest
from benchmark_scripts import load

from trustlens.synthetic import write_synthetic_run

ROOT = Path(__file__).resolve().parents[1]
SIZES = dict(steps=24, samples_per_step=32, seq_len=24)


@pytest.fixture(scope="module")
def bench():
    return load("collapse_alerts")


def test_alerts_against_collapses(bench, tmp_path, capsys):
    write_synthetic_run(tmp_path / "syn" / "collapse", **SIZES, rules=["ppo", "dppo_binary_tv"], collapse_at=16)
    write_synthetic_run(tmp_path / "syn" / "healthy", **SIZES, rules=["ppo"], seed=3)
    # the deeper folder takes its runs: `all` holds only what is outside syn/
    assert bench.main([f"all={tmp_path}", f"synthetic={tmp_path / 'syn'}", "--signals"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "== all: 0 runs" in out and "== synthetic: 2 runs" in out
    at = out.index("== synthetic: 2 runs")
    # the synthetic collapse: injected at step 16, the reward collapse test fires at 23; only an
    # outcome is critical, and 8 steps of a reward window are too few to confirm it: warnings only
    assert out[at + 1].split() == ["collapse", "ppo", "24", "steps", "collapse", "@23", "(reward)"]
    assert out[at + 3].split() == ["grad_norm_spike", "@16–23", "warning"]
    summary = next(line for line in out if line.startswith("synthetic: "))
    assert summary.startswith("synthetic: 0/1 collapsing runs had a critical alert before the collapse")
    assert summary.endswith("0/1 runs that did not collapse had a critical alert")
    assert out[-1].startswith("all: 0/1 collapsing runs")  # over every set


def test_the_sample_runs_carry_only_the_critical_alert_of_their_collapse(bench, capsys):
    bench.main([f"sample={ROOT / 'data' / 'sample_run'}", "--quiet"])
    warnings, line = capsys.readouterr().out.splitlines()[:2]
    assert line.startswith("sample: 1/1 collapsing runs had a critical alert before the collapse")
    assert line.endswith("0/3 runs that did not collapse had a critical alert")
    # the learning run's mismatch stays inside the normal range, and the ppo run's (fp8, 16 steps
    # stale, k3 about 0.05) follows its trailing baseline: no run that did not collapse warns
    assert warnings == "sample (warnings): 0/3 runs that did not collapse had a warning or critical alert"


def test_config_overrides(bench):
    with pytest.raises(SystemExit, match="unknown CollapseConfig field"):
        bench.main(["x=.", "--config", "nope=1"])
    with pytest.raises(SystemExit, match="NAME=FOLDER"):
        bench.main(["just-a-folder"])
