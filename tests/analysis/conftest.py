"""Small hand-built runs whose analysis results are worked out by hand in the tests."""

import math

import pytest

from trustlens.run import load_run
from trustlens.run.tables import write_run

L = math.log

# One row per token: (step, sample, pos, token, μ, π, advantage, blocked_ppo, blocked_dppo_binary_tv)
CLIP_ROWS = [
    (0, 0, 0, "a", 0.5, 0.7, 1.0, True, True),  # ratio 1.4 > 1.2; π − μ = 0.2 > 0.15
    (0, 0, 1, "b", 0.02, 0.04, 1.0, True, False),  # ratio 2; π − μ = 0.02
    (0, 1, 0, "a", 0.9, 0.95, -1.0, False, False),  # A ≤ 0 and π > μ: never blocked
    (0, 1, 1, "<b>x</b>", 1e-7, 1e-6, -1.0, False, False),
    (1, 2, 0, "b", 0.002, 0.001, -1.0, True, False),  # ratio 0.5 < 0.8
    (1, 2, 1, "a", 0.6, 0.4, -1.0, True, True),  # ratio 0.67; π − μ = −0.2
    (1, 3, 0, "c", 0.3, 0.3, 0.0, False, False),
    (1, 3, 1, "c", 0.05, 0.05, 0.0, False, None),  # the TV rule was not evaluated here
]


@pytest.fixture
def clip_run(tmp_path):
    cols = list(zip(*CLIP_ROWS, strict=True))
    tokens = {
        "step": cols[0],
        "sample": cols[1],
        "pos": cols[2],
        "token": cols[3],
        "mu_logp": [L(p) for p in cols[4]],
        "pi_logp": [L(p) for p in cols[5]],
        "ratio": [pi / mu for mu, pi in zip(cols[4], cols[5], strict=True)],
        "binary_tv": [abs(pi - mu) for mu, pi in zip(cols[4], cols[5], strict=True)],
        "advantage": cols[6],
        "blocked_ppo": cols[7],
        "blocked_dppo_binary_tv": cols[8],
    }
    return load_run(write_run(tmp_path / "clip", tokens=tokens))


# (step, update, sample, pos, μ, π_old, π) for the mismatch tests
MISMATCH_ROWS = [
    (0, 0, 0, 0, 0.5, 0.25, 0.25),
    (0, 0, 0, 1, 0.8, 0.8, 0.8),
    (0, 0, 1, 0, 0.125, 0.25, 0.25),
    (1, 0, 2, 0, 0.4, None, 0.5),  # no π_old: π of the first update stands in
    (1, 0, 3, 0, None, 0.3, 0.3),  # no μ: left out
    (1, 1, 4, 0, 0.4, None, 0.9),  # no π_old and not the first update: left out
]


@pytest.fixture
def mismatch_run(tmp_path):
    cols = list(zip(*MISMATCH_ROWS, strict=True))
    logs = [[None if p is None else L(p) for p in c] for c in cols[4:]]
    tokens = {
        "step": cols[0],
        "update": cols[1],
        "sample": cols[2],
        "pos": cols[3],
        "mu_logp": logs[0],
        "old_logp": logs[1],
        "pi_logp": logs[2],
    }
    return load_run(write_run(tmp_path / "mismatch", tokens=tokens))
