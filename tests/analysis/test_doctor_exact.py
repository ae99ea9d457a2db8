"""The doctor's `exact` check (trustlens.analysis.diagnosis.exact) on hand-built runs: ok when
bit-exact or far from it, a warning when nearly all tokens are bit-equal but not all, ok and not
judged where certification cannot be done (a lagging engine)."""

import numpy as np

from trustlens.analysis.diagnosis import doctor
from trustlens.analysis.diagnosis.exact import NEAR
from trustlens.run import load_run
from trustlens.run.tables import write_run

N = 100  # 4 samples × 25 positions


def _exact(tmp_path, differing: int, config=None):
    mu = -np.random.default_rng(0).uniform(0.01, 3.0, N).astype(np.float32)
    old = mu.copy()
    old[N - differing :] -= np.float32(1e-3)  # the last sample's last tokens
    tokens = {
        "step": [0] * N,
        "sample": [i // 25 for i in range(N)],
        "pos": [i % 25 for i in range(N)],
        "mu_logp": mu.tolist(),
        "old_logp": old.tolist(),
        "pi_logp": old.tolist(),
    }
    run = load_run(write_run(tmp_path / f"run{differing}", tokens=tokens, config=config))
    return {f.check: f for f in doctor(run, ["exact"])}["exact"]


def test_bit_exact_is_ok(tmp_path):
    f = _exact(tmp_path, 0)
    assert (f.verdict, f.summary) == ("ok", "log μ = log π_old (bit-exact, float32) on all 100 tokens")


def test_nearly_exact_warns_and_names_where(tmp_path):
    f = _exact(tmp_path, 5)
    assert f.verdict == "warning" and f.fix
    assert f.summary.startswith("log μ = log π_old bit for bit on 95.0% of 100 tokens, not all")
    assert "first at step 0 sample 3 pos 20" in f.summary
    assert "only row 3 of each step's batch of 4" in f.summary
    assert f.strength == 0.95 / NEAR and f.evidence["share"] == 0.95


def test_far_from_exact_is_ok(tmp_path):
    f = _exact(tmp_path, 50)
    assert f.verdict == "ok" and f.summary.endswith("not a zero-mismatch engine")


def test_a_lagging_engine_is_not_judged(tmp_path):
    f = _exact(tmp_path, 5, config={"rollout_lag": 2})
    assert f.verdict == "ok" and f.summary.startswith("not judged: ") and "rollout_lag 2" in f.summary
