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
    assert finding.summary.endswith("layers flipping most: 2 (40% flipped)")  # a layer without flips is not named
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


def _stale_run(path, *, fresh_flipped: int, split: dict | None = None, config: dict | None = None):
    """200 tokens over 2 responses, 3 layers (layer 0 dense, top-2 of 8). Response 1 (staleness 3,
    sampled with older weights): its first 60 tokens flip at layer 2 and are 0.5 nats off, the
    rest 0.01; response 0 (staleness 0): its first `fresh_flipped` tokens flip and are 0.01 nats
    off like the rest. `split`: the routing/* means logged at step 0."""
    n = 100
    mu = torch.tensor([[-1, -1], [0, 1], [2, 3]]).expand(2, n, 3, 2).clone()
    pi = mu.clone()
    pi[1, :60, 2] = torch.tensor([2, 4])
    pi[0, :fresh_flipped, 2] = torch.tensor([2, 4])
    d = torch.full((2, n), 0.01)
    d[1, :60] = 0.5
    with TokenRecorder(path, rules=["ppo"], model_kind="moe", config=config) as rec:
        rec.record(
            0,
            token_ids=torch.arange(n).expand(2, n),
            response_mask=torch.ones(2, n),
            pi_logp=-1.0 + d,
            mu_logp=torch.full((2, n), -1.0),
            advantages=torch.ones(2),
            staleness=torch.tensor([[0.0] * n, [3.0] * n]),
            mu_routed_experts=mu,
            pi_routed_experts=pi,
        )
        if split is not None:
            rec.log_metrics(0, split)
    return load_run(path)


def _split(k3_live: float, k3_replayed: float) -> dict:
    return {
        "routing/abs_dlogp_routing": 0.03,
        "routing/abs_dlogp_residual": 0.01,
        "routing/k3_live": k3_live,
        "routing/k3_replayed": k3_replayed,
    }


def test_a_stale_engine_is_not_blamed_on_routing(tmp_path):
    """The stale response's flipped tokens carry the mismatch (staleness moves both): judged over
    all tokens that would be a problem; with 20 flipped fresh tokens (< 50) it is not judged."""
    finding = _routing(_stale_run(tmp_path / "run", fresh_flipped=20))
    assert finding.verdict == "ok" and finding.summary.startswith("not judged: 40.0% of the tokens were routed")
    assert "μ is stale (the per-token staleness column)" in finding.summary
    assert "hold 20 flipped ones (fewer than 50)" in finding.summary and "--routing-split-every" in finding.summary
    assert finding.evidence["k3_share"] > 0.9 and finding.evidence["fresh"]["flipped_share"] == 0.2


def test_a_stale_run_is_judged_on_its_fresh_tokens(tmp_path):
    """60 flipped fresh tokens that are as far off as the unflipped: ok, said on the fresh ones."""
    finding = _routing(_stale_run(tmp_path / "run", fresh_flipped=60))
    assert finding.verdict == "ok"
    assert "of them were routed differently" in finding.summary
    assert "on the 100 tokens sampled with π_old's weights (the per-token staleness column)" in finding.summary
    assert abs(finding.evidence["fresh"]["k3_excess_share"]) < 1e-6


def test_a_stale_run_is_judged_by_its_measured_split(tmp_path):
    """With the shadow forward logged, its measured share of k3 decides: 1 − 0.4/1 = 0.6 ≥ 0.5 is
    a problem, 1 − 0.9/1 = 0.1 ok; each step's means weighted by its 200 tokens."""
    finding = _routing(_stale_run(tmp_path / "a", fresh_flipped=20, split=_split(1.0, 0.4)))
    assert finding.verdict == "problem" and finding.summary.startswith("routing causes most of the mismatch")
    assert "the shadow forward measured routing's part at 60% of k3 (75% of Σ|Δ log p|) over 1 steps" in finding.summary
    assert finding.evidence["split"] == {"steps": 1, "tokens": 200.0, "dlogp_share": 0.75, "k3_share": 0.6}
    assert "router replay" in finding.fix
    finding = _routing(_stale_run(tmp_path / "b", fresh_flipped=20, split=_split(1.0, 0.9)))
    assert finding.verdict == "ok" and finding.fix == ""
    assert abs(finding.evidence["split"]["k3_share"] - 0.1) < 1e-12


def test_a_replayed_run_says_so(tmp_path):
    run = _stale_run(tmp_path / "run", fresh_flipped=0, split=_split(1.0, 0.6), config={"routing_replay": True})
    finding = _routing(run)
    assert finding.verdict == "ok" and finding.summary.startswith("ok, routing replayed (R3)")
    assert "the part replay removes from the trainer's own routing at 40% of k3" in finding.summary
