"""The doctor's `routing` check (issue 49.4): a problem naming the share, the layers and the fix
when the flipped tokens carry the mismatch; ok when flips leave the log-probabilities as they
are; "ok, dense run" on a dense run."""

from __future__ import annotations

import math

import torch

from trustlens import TokenRecorder, load_run
from trustlens.analysis.diagnosis import doctor


def _run(path, dlogp_flipped: float, dlogp_rest: float, routed: bool = True):
    """10 tokens, 3 layers (layer 0 dense, top-2 of 8): tokens 0–3 flip at layer 2."""
    n = 10
    mu = torch.tensor([[-1, -1], [0, 1], [2, 3]]).expand(1, n, 3, 2).clone()
    pi = mu.clone()
    pi[0, :4, 2] = torch.tensor([2, 4])
    d = torch.tensor([dlogp_flipped] * 4 + [dlogp_rest] * 6)
    with TokenRecorder(path, rules=["ppo"], model_kind="moe" if routed else "dense") as rec:
        rec.record(
            0,
            token_ids=torch.arange(n)[None],
            response_mask=torch.ones(1, n),
            pi_logp=(-1.0 + d)[None],
            mu_logp=torch.full((1, n), -1.0),
            advantages=torch.ones(1),
            **(dict(mu_routed_experts=mu, pi_routed_experts=pi) if routed else {}),
        )
    return load_run(path)


def _routing(run):
    (finding,) = doctor(run, checks=["routing"])
    return finding


def test_routing_named_as_the_cause(tmp_path):
    finding = _routing(_run(tmp_path / "run", 0.5, 0.01))
    k3 = [math.exp(0.5) - 1.5, math.exp(0.01) - 1.01]
    carried = 4 * k3[0] / (4 * k3[0] + 6 * k3[1])
    assert finding.verdict == "problem"
    assert finding.summary.startswith("routing causes most of the mismatch: 40.0% of the tokens were routed")
    assert f"they carry {carried:.0%} of the run's k3" in finding.summary
    assert "layers flipping most: 2 (40% flipped), 1 (0% flipped)" in finding.summary
    assert abs(finding.evidence["k3_share"] - carried) < 1e-5
    assert abs(finding.evidence["k3_excess_share"] - (4 * k3[0] - 4 * k3[1]) / (4 * k3[0] + 6 * k3[1])) < 1e-5
    assert finding.evidence["layers"][0] == {"layer": 2, "tokens": 10, "flips": 4, "flip_rate": 0.4}
    assert "router replay" in finding.fix and "fp32" in finding.fix


def test_flips_that_change_nothing_are_ok(tmp_path):
    finding = _routing(_run(tmp_path / "run", 0.1, 0.1))
    assert finding.verdict == "ok" and finding.fix == ""
    assert abs(finding.evidence["k3_share"] - 0.4) < 1e-5 and abs(finding.evidence["k3_excess_share"]) < 1e-5


def test_quiet_on_a_dense_run(tmp_path):
    finding = _routing(_run(tmp_path / "run", 0.5, 0.01, routed=False))
    assert (finding.verdict, finding.summary) == ("ok", "ok, dense run: no routed experts recorded")
    assert finding.evidence == {} and finding.fix == ""
