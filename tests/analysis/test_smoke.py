"""Every analysis query runs on a synthetic run and returns its documented columns."""

import pytest

from trustlens import analysis
from trustlens.run import load_run
from trustlens.synthetic import write_synthetic_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = write_synthetic_run(
        tmp_path_factory.mktemp("smoke") / "run", steps=16, samples_per_step=16, seq_len=16, collapse_at=10
    )
    return load_run(path)


def test_queries_run(run):
    t = run.tokens
    assert analysis.blocked_per_step(t).columns == ["step", "rule", "count", "blocked", "blocked_frac"]
    assert analysis.blocked_by_token(t, "ppo").columns == ["rule", "token", "count", "blocked", "blocked_frac"]
    assert analysis.blocked_by_bucket(t).height == 6 * len(run.rules)
    assert analysis.blocked_by_advantage_sign(t).height == 3 * len(run.rules)
    assert analysis.rule_confusion(t, "ppo", "dppo_binary_tv").height == 16
    assert analysis.confusion_matrix(t).height == len(run.rules) ** 2
    assert analysis.figure1_density(t, rules=["ppo"])["count"].sum() == t.collect().height
    assert analysis.mismatch_per_step(t).height == 16
    assert analysis.step_summary(t).height == 16
    alerts = analysis.detect_collapse(run)
    steps = alerts.filter(alerts["kind"] == "entropy_collapse")["step"].to_list()
    assert len(steps) == 1 and 10 <= steps[0] <= 12  # the collapse ramps up over three steps
