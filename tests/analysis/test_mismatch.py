import math

import numpy as np
import polars as pl
import pytest

from trustlens.analysis import MISMATCH_COLUMNS, mismatch_by_bucket, mismatch_per_step, mismatch_unavailable
from trustlens.run import load_run
from trustlens.run.tables import write_run
from trustlens.synthetic import write_synthetic_run

L = math.log


def test_per_step_by_hand(mismatch_run):
    df = mismatch_per_step(mismatch_run.tokens)
    assert df.columns == ["step", *MISMATCH_COLUMNS]
    s0, s1 = df.iter_rows(named=True)
    # step 0: ρ = π_old/μ = 0.5, 1, 2 over samples {0: (0.5, 1), 1: (2,)}
    assert s0["tokens"] == 3
    assert s0["mismatch_kl"] == pytest.approx(0.0, abs=1e-7)
    assert s0["k3_kl"] == pytest.approx(((0.5 - 1 - L(0.5)) + 0 + (2 - 1 - L(2))) / 3, rel=1e-6)
    assert s0["chi2_token"] == pytest.approx((0.25 + 1 + 4) / 3 - 1, rel=1e-6)
    assert s0["log_ppl_diff"] == pytest.approx(((-L(0.5)) / 2 + (-L(2))) / 2, rel=1e-6)
    assert s0["log_ppl_abs_diff"] == pytest.approx((L(2) / 2 + L(2)) / 2, rel=1e-6)
    assert s0["chi2_seq"] == pytest.approx(((0.25 - 1) + (4 - 1)) / 2, rel=1e-6)
    assert s0["prob_diff_mean"] == pytest.approx((0.25 + 0 + 0.125) / 3, rel=1e-6)
    assert s0["prob_diff_max"] == pytest.approx(0.25, rel=1e-6)
    assert s0["prob_pearson"] == pytest.approx(np.corrcoef([0.5, 0.8, 0.125], [0.25, 0.8, 0.25])[0, 1], rel=1e-6)
    # step 1: only the first-update row without π_old counts, with π (0.5) standing in for π_old
    assert s1["tokens"] == 1
    assert s1["mismatch_kl"] == pytest.approx(L(0.4 / 0.5), rel=1e-6)
    assert s1["k3_kl"] == pytest.approx(1.25 - 1 - L(1.25), rel=1e-5)
    assert s1["prob_pearson"] is None  # one token: no correlation


def test_by_bucket_by_hand(mismatch_run):
    df = mismatch_by_bucket(mismatch_run.tokens)
    assert df["tokens"].to_list() == [0, 0, 0, 0, 0, 4]  # μ = 0.125 … 0.8 are all in [0.1, 1]
    top = df.row(5, named=True)
    assert top["k3_kl"] == pytest.approx(((0.5 - 1 - L(0.5)) + (2 - 1 - L(2)) + (1.25 - 1 - L(1.25))) / 4, rel=1e-5)
    assert df.row(0, named=True)["k3_kl"] is None


def test_without_mu_says_why(tmp_path):
    run = load_run(
        write_synthetic_run(tmp_path / "r", steps=2, samples_per_step=8, seq_len=4, rules=["ppo"], with_mu=False)
    )
    reason = mismatch_unavailable(run.tokens)
    assert "without the rollout engine's log-probabilities" in reason
    df = mismatch_per_step(run.tokens)
    assert df.is_empty() and df.columns == ["step", *MISMATCH_COLUMNS]
    assert mismatch_by_bucket(run.tokens).is_empty()


def test_empty_and_unpaired(tmp_path, mismatch_run):
    assert mismatch_unavailable(mismatch_run.tokens.filter(pl.lit(False))) == "the run has no token rows yet"
    assert mismatch_per_step(mismatch_run.tokens.filter(pl.lit(False))).is_empty()
    run = load_run(
        write_run(
            tmp_path / "r",
            tokens={"step": [0], "update": [1], "sample": [0], "pos": [0], "mu_logp": [-1.0], "pi_logp": [-1.0]},
        )
    )
    assert "no row has both" in mismatch_unavailable(run.tokens)
    assert mismatch_unavailable(mismatch_run.tokens) is None


def test_synthetic_collapse_grows_mismatch(tmp_path):
    run = load_run(
        write_synthetic_run(tmp_path / "r", steps=10, samples_per_step=16, seq_len=16, rules=[], collapse_at=6)
    )
    df = mismatch_per_step(run.tokens)
    assert df.filter(pl.col("step") >= 8)["k3_kl"].min() > 10 * df.filter(pl.col("step") < 6)["k3_kl"].median()
    assert (df["k3_kl"] >= 0).all()


def test_only_chi2_is_clamped_as_in_verl(tmp_path):
    """verl's compute_offpolicy_metrics clamps log ρ only for χ²; kl and k3_kl use it as it is."""
    mu, old = [-35.0, -1.0], [-5.0, -1.0]  # log ρ = 30 on the first token, 0 on the second
    tokens = {
        "step": [0, 0],
        "update": [0, 0],
        "sample": [0, 0],
        "pos": [0, 1],
        "mu_logp": mu,
        "old_logp": old,
        "pi_logp": old,
    }
    s = mismatch_per_step(load_run(write_run(tmp_path / "r", tokens=tokens)).tokens).row(0, named=True)
    assert s["k3_kl"] == pytest.approx((math.exp(30) - 1 - 30) / 2, rel=1e-9)  # not e^20 − 21
    assert s["mismatch_kl"] == pytest.approx(-30 / 2)
    assert s["chi2_token"] == pytest.approx((math.exp(40) + 1) / 2 - 1, rel=1e-9)  # log ρ clamped to 20
    assert s["chi2_seq"] == pytest.approx(math.exp(40) - 1, rel=1e-9)  # Σ log ρ = 30 clamped to 20


def test_zero_trainer_probability_gives_inf(tmp_path):
    tokens = {
        "step": [0],
        "update": [0],
        "sample": [0],
        "pos": [0],
        "mu_logp": [-0.1],
        "old_logp": [-math.inf],
        "pi_logp": [-1.0],
    }
    s = mismatch_per_step(load_run(write_run(tmp_path / "r", tokens=tokens)).tokens).row(0, named=True)
    assert s["mismatch_kl"] == math.inf and s["k3_kl"] == math.inf and s["log_ppl_diff"] == math.inf
    assert s["chi2_token"] == pytest.approx(math.exp(-40) - 1)


def test_columns_are_registry_names():
    from trustlens.metrics import METRICS, MISMATCH_METRICS

    assert list(MISMATCH_COLUMNS) == ["tokens", *MISMATCH_METRICS]
    assert all(name in METRICS for name in MISMATCH_METRICS)
