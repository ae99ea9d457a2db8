"""benchmarks/alert_bench.py, small: the cache is made once and the table is read from it, old
detectors beside new ones when an old tree is given."""

import json
from pathlib import Path

from benchmark_scripts import load

from trustlens.synthetic import Drift, write_synthetic_run

bench = load("alert_bench")


def test_the_table_is_read_from_the_cache(tmp_path):
    runs = tmp_path / "cache" / "runs"
    common = dict(steps=300, samples_per_step=16, seq_len=8, group_size=8, rules=["ppo"], active_rule="ppo")
    write_synthetic_run(runs / "healthy", drift=Drift(warmup_steps=30, eval_every=20), **common)
    write_synthetic_run(runs / "collapse", drift=Drift(warmup_steps=30, eval_every=20), collapse_at=200, **common)
    table = bench.table(tmp_path / "cache", None)
    rows = {
        line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ") and "new" in line
    }
    healthy, collapse = rows["healthy"].split(" | "), rows["collapse"].split(" | ")
    assert healthy[1:5] == ["300", "", "new", "270"]  # 300 steps, 30 of warm-up
    assert healthy[5] == "0.00"  # no false critical alert
    # the collapse (collapse_onset) comes after the injection at step 200, and is warned of
    assert int(collapse[2]) >= 200 and collapse[8] == "yes"
    assert table.splitlines()[-1].startswith("new: ") and " 0.00 critical" in table.splitlines()[-1]
    assert bench.table(tmp_path / "cache", None) == table  # the same from the same cache


def test_the_specs_cover_the_issue_s_runs():
    specs = bench.builtin_specs(1500, 3)
    healthy = [s for s in specs.values() if s["preset"] in bench.HEALTHY_PRESETS]
    assert len(healthy) == 12 and {s["warmup-steps"] for s in healthy} == {0, 100}
    assert sum(s["preset"] == "late_collapse" for s in specs.values()) == 3
    assert Path(bench.REPO / "data" / "sample_run").is_dir()


def test_a_run_still_being_written_is_left_out_and_a_rewritten_run_is_not_read_from_the_cache(tmp_path, capsys):
    runs = tmp_path / "cache" / "runs"
    common = dict(steps=40, samples_per_step=8, seq_len=8, group_size=8, rules=["ppo"], active_rule="ppo")
    done, training = write_synthetic_run(runs / "done", **common), write_synthetic_run(runs / "training", **common)
    manifest = json.loads((training / "run.json").read_text())
    (training / "run.json").write_text(json.dumps(manifest | {"status": "running"}))
    assert bench.finished_runs(tmp_path / "cache") == [done]
    assert "skipping training: still being written" in capsys.readouterr().err
    before = bench.identity(done)
    manifest = json.loads((done / "run.json").read_text())
    (done / "run.json").write_text(json.dumps(manifest | {"updated": "2030-01-01T00:00:00+00:00"}))
    assert bench.identity(done) != before and bench.identity(done).startswith(f"{done}#")
