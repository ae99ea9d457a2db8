"""Outcomes over seeds (`trustlens.analysis.seeds`) across recorded and imported runs: a run
exported to TensorBoard and imported counts as the recorded run does (issue 51, point 3)."""

import pytest

from trustlens import load_run
from trustlens.analysis.seeds import run_outcomes, seed_table
from trustlens.export import export_tensorboard
from trustlens.ingest import import_log
from trustlens.synthetic import write_synthetic_run

SAME = (
    "n",
    "collapsed",
    "steps_to_collapse_mean",
    "k3_start_mean",
    "k3_end_mean",
    "k3_end_se",
    "tv_end_mean",
    "tv_end_se",
)


def test_mean_and_standard_error_over_a_recorded_and_an_imported_seed(tmp_path):
    runs = [
        write_synthetic_run(tmp_path / f"seed{s}", steps=20, samples_per_step=16, seq_len=16, seed=s, collapse_at=10)
        for s in (0, 1)
    ]
    export_tensorboard([runs[1]], tmp_path / "tb")
    import_log(tmp_path / "tb" / "seed1", tmp_path / "seed1-imported")
    recorded = seed_table(run_outcomes([load_run(r) for r in runs]))
    mixed = seed_table(run_outcomes([load_run(runs[0]), load_run(tmp_path / "seed1-imported")]))
    assert mixed["rule"].to_list() == recorded["rule"].to_list() == ["ppo"]
    for column in SAME:
        assert mixed[column].to_list() == pytest.approx(recorded[column].to_list(), rel=1e-5), column
    assert mixed["n"].item() == 2 and mixed["k3_end_se"].item() > 0
    # an imported run's block rate is the mean of its logged per-step rates (no token counts)
    assert mixed["block_rate_mean"].item() == pytest.approx(recorded["block_rate_mean"].item(), abs=0.01)
    imported = run_outcomes([load_run(tmp_path / "seed1-imported")])
    assert imported["block_rate_low_mu"].item() is None
