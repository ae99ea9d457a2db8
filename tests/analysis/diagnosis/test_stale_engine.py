"""A stale engine by design (config rollout_lag, or the per-token staleness column) is an older
policy: its μ differs from π_old by the policy's movement over the lag. The checks that would
read that difference as a bug (sentinel, token_ids, frozen_policy) judge the fresh tokens, or
allow for the lag, and still name the bug on the same run without word of staleness."""

import math

import pytest

from trustlens import load_run
from trustlens.analysis.diagnosis import inputs_of
from trustlens.analysis.diagnosis.alignment import sentinel_check, token_ids_check
from trustlens.analysis.diagnosis.engine_weights import frozen_policy_check, updates_behind
from trustlens.run.tables import write_run

LAG = "rollout_lag 16: μ is up to 16 steps stale"


def _sharpened(path, config=None, staleness=None):
    """Step 0: μ = π_old = 0.3 on 200 tokens (the engine fresh). Steps 1–2 (400 tokens): an older
    policy grown sharp, μ = 1 on 20 tokens π_old gives 0.3 (log μ = 0: a sentinel's look) and
    μ = 0.6 on 20 tokens π_old gives 1e-4 (a wrong id's look); μ = π_old on the rest."""
    n = 200
    old = [math.log(0.3)] * (n + 160) + [math.log(1e-4)] * 20 + [math.log(0.3)] * 220
    mu = list(old)
    mu[n + 160 : n + 180] = [math.log(0.6)] * 20
    mu[n + 180 : n + 200] = [0.0] * 20
    tokens = {
        "step": [0] * n + [1] * n + [2] * n,
        "sample": list(range(3 * n)),
        "pos": [0] * (3 * n),
        "mu_logp": mu,
        "old_logp": old,
        "pi_logp": old,
    }
    if staleness is not None:
        tokens["staleness"] = staleness
    return inputs_of(load_run(write_run(path, tokens=tokens, rules=[], config=config)))


def test_a_sharpened_stale_policy_is_not_read_as_sentinels_or_wrong_ids(tmp_path):
    # without word of staleness: 20 zeros of 600 visible tokens (3.3% ≥ 1%) and 20 wrong-id looks
    # (3.3% of the tokens, half of the 40 beyond [0.5, 2]: isolation 0.5 ≥ 0.3) are problems
    bare = _sharpened(tmp_path / "bare")
    sentinel, ids = sentinel_check(bare), token_ids_check(bare)
    assert (sentinel.verdict, sentinel.evidence["zeros"]) == ("problem", 20)
    assert sentinel.evidence["share_of_visible"] == pytest.approx(20 / 580)
    assert (ids.verdict, ids.evidence["count"], ids.evidence["isolation"]) == ("problem", 20, 0.5)
    # rollout_lag 16: judged on step 0, where μ is π_old's weights' and agrees
    lagged = _sharpened(tmp_path / "lag", config={"rollout_lag": 16})
    for f in (sentinel_check(lagged), token_ids_check(lagged)):
        assert f.verdict == "ok" and f.evidence["stale"] == LAG
        assert f.summary.endswith(f"on the tokens sampled with π_old's weights ({LAG})")
    # the per-token staleness column says the same
    column = _sharpened(tmp_path / "col", staleness=[0.0] * 200 + [4.0] * 400)
    for f in (sentinel_check(column), token_ids_check(column)):
        assert f.verdict == "ok" and f.evidence["stale"] == "the per-token staleness column"


def _drifting(path, config):
    """9 steps of 300 tokens over 10 token ids; d = log μ − log π_old = ±c_t per id (a weight
    difference: the id explains all of it), c_t from 0.01 to 0.09 (k3 ≈ c²/2: ×81 growth); half
    the rows at update 1 with π 0.001 nats above π_old (the policy's movement)."""
    steps, per = 9, 300
    step = [t for t in range(steps) for _ in range(per)]
    ids = [i % 10 for i in range(steps * per)]
    c = [0.01 * (t + 1) for t in step]
    old = [-1.0] * len(step)
    update = [i % 2 for i in range(len(step))]
    tokens = {
        "step": step,
        "sample": list(range(len(step))),
        "pos": [0] * len(step),
        "update": update,
        "token_id": ids,
        "mu_logp": [o + (ci if k % 2 else -ci) for o, ci, k in zip(old, c, ids, strict=True)],
        "old_logp": old,
        "pi_logp": [o + 0.001 * u for o, u in zip(old, update, strict=True)],
    }
    return inputs_of(load_run(write_run(path, tokens=tokens, rules=[], config=config)))


def test_frozen_policy_allows_for_the_policy_s_movement_over_the_lag(tmp_path):
    # fresh engine: mean |d| grows 0.01–0.03 → 0.07–0.09 (by 0.06), π moves 0.001 nats per update:
    # 0.001 × 10 < 0.06, too little to explain it; the id explains all of d: a problem
    fresh = frozen_policy_check(_drifting(tmp_path / "fresh", {"lr": 1e-4, "minibatches": 4, "epochs": 1}))
    assert fresh.verdict == "problem" and "π moves 1e-3 nats per update, too little" in fresh.summary
    assert fresh.evidence["updates_behind"] == 0.0 and fresh.evidence["mean_abs_d_growth"] == pytest.approx(0.06)
    # μ 16 steps of 4 updates stale: 0.001 × 64 × 10 = 0.64 ≥ 0.06, the lag's movement explains it
    config = {"lr": 1e-4, "minibatches": 4, "epochs": 1, "rollout_lag": 16}
    lagged = frozen_policy_check(_drifting(tmp_path / "lag", config))
    assert lagged.verdict == "ok" and lagged.evidence["updates_behind"] == 64.0
    assert "over the 64 updates μ's weights are behind (rollout_lag 16 steps of 4 updates) explains it" in (
        lagged.summary
    )
    # a policy that never moves (lr = 0) explains no drift, however stale the engine
    frozen = frozen_policy_check(_drifting(tmp_path / "lr0", config | {"lr": 0.0}))
    assert frozen.verdict == "problem" and "while lr = 0" in frozen.summary


def test_updates_behind_by_hand(tmp_path):
    inp = _drifting(tmp_path / "a", {"rollout_lag": 3, "minibatches": 2, "epochs": 3})
    assert updates_behind(inp, 0) == (18.0, "rollout_lag 3 steps of 6 updates")
    assert updates_behind(_drifting(tmp_path / "b", {"rollout_lag": 2}), 0) == (2.0, "rollout_lag 2 steps of 1 updates")
    assert updates_behind(_drifting(tmp_path / "c", {}), 0) == (0.0, None)
    column = _sharpened(tmp_path / "col", config={"rollout_lag": 16}, staleness=[0.0] * 200 + [4.0] * 400)
    # the column wins over the config: from step 1 every token is 4 updates stale, over all 600 a mean of 8/3
    assert updates_behind(column, 1) == (4.0, "the per-token staleness column")
    assert updates_behind(column, 0)[0] == pytest.approx(8 / 3)
