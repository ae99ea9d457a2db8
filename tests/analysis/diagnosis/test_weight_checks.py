"""The checks added in issue 50: frozen_policy, resume, sequence_sum and truncation_bias. Each is
named first as a problem on its planted defect (benchmarks/doctor_detection.py, three seeds, both
forms), its clean twin is ok, and each statistic matches a hand-checked value."""

import json
import math

import numpy as np
import pytest
from benchmark_scripts import load

from trustlens import load_run
from trustlens.analysis import doctor
from trustlens.analysis.diagnosis import inputs_of
from trustlens.analysis.diagnosis.engine_weights import resume_check, systematic_share
from trustlens.analysis.diagnosis.sequence_weight import sequence_sum_check, sum_share
from trustlens.analysis.diagnosis.support import moved_across, truncation_bias_check
from trustlens.run.tables import write_run

bench = load("doctor_detection")
NEW = ["frozen_policy", "resume", "sequence_sum", "truncation_bias"]


@pytest.mark.parametrize("seed", [0, 5, 9])
@pytest.mark.parametrize("defect", NEW)
def test_planted_defect_is_named_first_and_its_clean_twin_is_ok(tmp_path, defect, seed):
    for logit_columns in (False, True):
        found = doctor(bench.write_planted(tmp_path / f"{defect}-{logit_columns}", defect, seed, logit_columns))
        assert (found[0].check, found[0].verdict) == (defect, "problem"), found[0].summary
        assert found[0].fix and found[0].evidence["examples"]
        clean = doctor(bench.write_planted(tmp_path / f"clean-{logit_columns}", "clean", seed, logit_columns))
        assert [(f.check, f.verdict) for f in clean if f.verdict != "ok"] == []
        assert {f.check: f.verdict for f in clean}[defect] == "ok"


def _run(tmp_path, tokens, manifest=None, name="run"):
    path = write_run(tmp_path / name, tokens=tokens, rules=["ppo"])
    if manifest:
        run_json = path / "run.json"
        run_json.write_text(json.dumps({**json.loads(run_json.read_text()), **manifest}))
    return inputs_of(load_run(path))


def test_systematic_share_by_hand(tmp_path):
    # two token ids with d = ±a and no noise: all the variance is between the ids; ω² with
    # k = 2, n = 400: SS_between = SS_total = n·a², MS_within = 0 → ω² = 1
    n, a = 400, 0.05
    ids = [0, 1] * (n // 2)
    old = [-1.0] * n
    mu = [-1.0 + (a if i == 0 else -a) for i in ids]
    tokens = {"step": [0] * n, "sample": list(range(n)), "pos": [0] * n, "token_id": ids}
    inp = _run(tmp_path, {**tokens, "mu_logp": mu, "old_logp": old, "pi_logp": old})
    share, rows = systematic_share(inp.pairs)
    assert rows == n and share == pytest.approx(1.0, abs=1e-4)
    # noise alone (no id effect): ω² ≈ 0, within its sampling error (k − 1)/n
    noisy = list(-1.0 + np.random.default_rng(0).normal(0, a, n))
    share, _ = systematic_share(
        _run(tmp_path, {**tokens, "mu_logp": noisy, "old_logp": old, "pi_logp": old}, name="n").pairs
    )
    assert abs(share) < 0.02


def test_resume_jump_by_hand(tmp_path):
    # k3 per step: 1e-4 before the resume after step 2, 1e-2 after it: j = j_end = 100
    rng = np.random.default_rng(0)
    steps, per = 9, 200
    step = np.repeat(np.arange(steps), per)
    # d = log μ − log π_old = −x gives k3 = e^x − 1 − x ≈ x²/2: x = √(2·k3)
    x = np.where(step <= 2, math.sqrt(2e-4), math.sqrt(2e-2)) * rng.choice([-1.0, 1.0], step.size)
    old = np.full(step.size, -1.0)
    tokens = {
        "step": step.tolist(),
        "sample": np.arange(step.size).tolist(),
        "pos": [0] * step.size,
        "mu_logp": (old - x).tolist(),
        "old_logp": old.tolist(),
        "pi_logp": old.tolist(),
    }
    f = resume_check(_run(tmp_path, tokens, {"resumed_after": [2]}))
    assert f.verdict == "problem" and "step 3" in f.summary
    point = f.evidence["points"][0]
    assert point["jump"] == pytest.approx(100.0, rel=0.05) and point["jump_at_end"] == pytest.approx(100.0, rel=0.05)
    early = resume_check(_run(tmp_path, tokens, {"resumed_after": [0]}, name="early"))  # one step before it
    assert early.verdict == "ok" and early.summary.startswith("too few steps around the resume points [0]")
    assert resume_check(_run(tmp_path, tokens, name="none")).summary.startswith("no resume recorded")
    # a resume whose step falls back (the engine caught up at the next sync) warns
    back = np.where(step >= 6, 0.1, 1.0) * x  # steps 6–8 back at k3 ≈ 1e-4
    f = resume_check(_run(tmp_path, {**tokens, "mu_logp": (old - back).tolist()}, {"resumed_after": [2]}, name="b"))
    assert f.verdict == "warning" and "falls back" in f.summary


def test_sum_share_by_hand(tmp_path):
    # 40 responses of 5 tokens, log(π_old/μ) = −0.01 on each token: mean −0.01, sum −0.05
    n_resp, length = 40, 5
    old = np.full(n_resp * length, -1.0)
    mu = old + 0.01
    sample = np.repeat(np.arange(n_resp), length)
    base = {
        "step": [0] * old.size,
        "sample": sample.tolist(),
        "pos": np.tile(np.arange(length), n_resp).tolist(),
        "mu_logp": mu.tolist(),
        "old_logp": old.tolist(),
        "pi_logp": old.tolist(),
        "seq_logratio_mu": [-0.01 * length] * old.size,  # Σ log(π/μ)
        "seq_logratio_old": [0.0] * old.size,  # π = π_old
        "seq_tokens": [length] * old.size,
    }
    summed = _run(tmp_path, {**base, "seq_weight": [math.exp(-0.05)] * old.size}, name="sum")
    stats = sum_share(summed)
    assert stats["share_nearer_sum"] == 1.0 and stats["responses"] == n_resp
    assert stats["median_log_weight_over_mean"] == pytest.approx(length, rel=1e-4)  # the weight scales with |y|
    assert sequence_sum_check(summed).verdict == "problem"
    mean = _run(tmp_path, {**base, "seq_weight": [math.exp(-0.01)] * old.size}, name="mean")
    assert sum_share(mean)["share_nearer_sum"] == 0.0 and sequence_sum_check(mean).verdict == "ok"
    assert sequence_sum_check(_run(tmp_path, base, name="none")).summary.startswith("no sequence weight")


def test_truncation_bias_moves_tokens_across_the_rule_by_hand(tmp_path):
    # ppo (0.2 / 0.2) anchored on μ; S = 0.7: the recorded ratio π/μ = 0.7 blocks every A < 0
    # token (ratio < 0.8); renormalised over the support it is 1: none is blocked. A > 0 tokens
    # are not blocked either way: half the A ≠ 0 tokens change, all out of blocked
    n = 100
    old = [math.log(0.35)] * n
    mu = [math.log(0.35 / 0.7)] * n
    adv = [1.0, -1.0] * (n // 2)
    tokens = {"step": [0] * n, "sample": list(range(n)), "pos": [0] * n, "advantage": adv}
    inp = _run(tmp_path, {**tokens, "mu_logp": mu, "old_logp": old, "pi_logp": old, "pi_support_mass": [0.7] * n})
    moved = moved_across(inp)
    assert moved["rule"] == "ppo" and moved["tokens"] == n
    assert moved["share"] == pytest.approx(0.5) and moved["out_of"] == pytest.approx(0.5) and moved["into"] == 0.0
    f = truncation_bias_check(inp)
    assert f.verdict == "problem" and f.evidence["mean_log_mass"] == pytest.approx(-math.log(0.7), abs=1e-6)
    assert "log S = -0.3567" in f.summary and "50.00% of the 100 A ≠ 0 tokens across ppo's threshold" in f.summary


def test_a_sequence_weight_recorded_by_the_recorder_is_checked(tmp_path):
    # record(seq_weight=) stores the trainer's weight per token; summed over the response it is
    # named, averaged it is ok
    import torch

    from trustlens import TokenRecorder

    for how in ("sum", "mean"):
        path = tmp_path / how
        with TokenRecorder(path, rules=["ppo"]) as rec:
            for step in range(2):
                g = torch.Generator().manual_seed(step)
                old = torch.log(torch.rand(32, 10, generator=g) * 0.8 + 0.1)
                mu = torch.clamp(old + 0.02 * torch.randn(32, 10, generator=g), max=-1e-4)
                log_ratio = (old - mu).sum(1, keepdim=True) / (1 if how == "sum" else 10)
                rec.record(
                    step,
                    token_ids=torch.randint(0, 9, (32, 10), generator=g),
                    response_mask=torch.ones(32, 10),
                    pi_logp=old,
                    old_logp=old,
                    mu_logp=mu,
                    advantages=torch.linspace(-1, 1, 32),
                    seq_weight=log_ratio.exp().expand(32, 10),
                )
        f = {f.check: f for f in doctor(path)}["sequence_sum"]
        assert f.verdict == ("problem" if how == "sum" else "ok")
        assert f.evidence["median_log_weight_over_mean"] == pytest.approx(10.0 if how == "sum" else 1.0, rel=1e-3)
