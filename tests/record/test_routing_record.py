"""Routing in the record (issue 49.2, 49.7): `record(mu_routed_experts=, pi_routed_experts=)`
gives each token row route_flips, route_first_flip, route_overlap and the expert sets of its
flipped layers, and the `routing` table exact per-layer counts, sampled or not, on the CPU path
and on the accelerator's (staged) path; bad routing raises one clear line and records nothing."""

from __future__ import annotations

import pytest
import torch

from trustlens import Keep, load_run
from trustlens.record import TokenRecorder

# one response of 3 valid tokens and a padding position; 3 layers (0 dense), k = 2:
#   t0: L1 {0,1} vs {1,0} (same set), L2 {2,3} vs {2,4} (flip)     -> flips 1, first 2, overlap (1 + 1/2)/2
#   t1: L1 {0,1} vs {2,3} (flip),    L2 {4,5} vs {5,6} (flip)     -> flips 2, first 1, overlap (0 + 1/2)/2
#   t2: the same sets on both sides                               -> flips 0, first null, overlap 1
D = [-1, -1]
MU = [[D, [0, 1], [2, 3]], [D, [0, 1], [4, 5]], [D, [6, 7], [0, 7]], [D, [99, 99], [99, 99]]]
PI = [[D, [1, 0], [2, 4]], [D, [2, 3], [5, 6]], [D, [7, 6], [7, 0]], [D, [-5, 1], [99, 99]]]


def _call(**over):
    kw = dict(
        token_ids=torch.tensor([[5, 6, 7, 0]]),
        response_mask=torch.tensor([[1, 1, 1, 0]]),
        pi_logp=torch.tensor([[-1.0, -2.0, -0.5, 0.0]]),
        mu_logp=torch.tensor([[-1.1, -1.0, -0.5, 0.0]]),
        advantages=torch.ones(1),
        mu_routed_experts=torch.tensor([MU]),
        pi_routed_experts=torch.tensor([PI]),
        num_experts=8,
    )
    kw.update(over)
    return kw


class StagedRecorder(TokenRecorder):
    _staged_on_cpu = True  # the accelerator's path (one host synchronisation), on CPU tensors


@pytest.mark.parametrize("recorder", [TokenRecorder, StagedRecorder])
@pytest.mark.parametrize("keep", [None, Keep(rate=0.5, low_mu=1e-9, top_share=1e-9)])
def test_route_columns_and_table(tmp_path, recorder, keep):
    with recorder(tmp_path / "run", rules=["ppo"], keep=keep) as rec:
        assert rec.record(0, **_call()) == 3
        assert rec.record(1, **_call()) == 3
    run = load_run(tmp_path / "run")
    rows = run.tokens.filter(step=0).sort("pos").collect()
    table = run.routing.sort("step", "layer").collect()
    assert table.select("step", "update", "rank", "layer", "tokens", "flips", "overlap").rows() == [
        (0, 0, 0, 1, 3, 1, 2.0),
        (0, 0, 0, 2, 3, 2, 2.0),
        (1, 0, 0, 1, 3, 1, 2.0),
        (1, 0, 0, 2, 3, 2, 2.0),
    ]
    expected = {
        0: (1, 2, 0.75, [2], [2, 3], [2, 4]),
        1: (2, 1, 0.25, [1, 2], [0, 1, 4, 5], [2, 3, 5, 6]),
        2: (0, None, 1.0, [], [], []),
    }
    names = ["route_flips", "route_first_flip", "route_overlap", "route_layers", "route_mu_experts"]
    got = {r["pos"]: tuple(r[c] for c in [*names, "route_pi_experts"]) for r in rows.iter_rows(named=True)}
    assert set(got) <= set(expected) and (keep is not None or len(got) == 3)
    for pos, row in got.items():
        assert row == expected[pos]
    assert rows.schema["route_flips"] == rows.schema["route_first_flip"] == __import__("polars").Int16


def test_dense_run_has_no_routing(tmp_path):
    call = _call(mu_routed_experts=None, pi_routed_experts=None, num_experts=None)
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        rec.record(0, **call)
    run = load_run(tmp_path / "run")
    assert run.routing.collect().height == 0
    assert run.tokens.collect()["route_flips"].null_count() == 3


def test_all_layers_dense(tmp_path):
    dense = torch.full((1, 4, 3, 2), -1)
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        rec.record(0, **_call(mu_routed_experts=dense, pi_routed_experts=dense))
    run = load_run(tmp_path / "run")
    rows = run.tokens.collect()
    assert rows["route_flips"].to_list() == [0, 0, 0]
    assert rows["route_overlap"].null_count() == 3 and rows["route_first_flip"].null_count() == 3
    assert run.routing.collect().height == 0


BAD = [
    (dict(pi_routed_experts=None), "mu_routed_experts was given without pi_routed_experts"),
    (dict(mu_routed_experts=None), "pi_routed_experts was given without mu_routed_experts"),
    (dict(mu_routed_experts=None, pi_routed_experts=None), "num_experts was given without"),
    (dict(mu_routed_experts=torch.zeros(1, 4, 3, dtype=torch.long)), r"mu_routed_experts has shape \(1, 4, 3\)"),
    (dict(pi_routed_experts=torch.zeros(2, 4, 3, 2, dtype=torch.long)), "pi_routed_experts has shape"),
    (dict(mu_routed_experts=torch.zeros(1, 4, 3, 2)), "mu_routed_experts must be an integer tensor"),
    (dict(pi_routed_experts=torch.zeros(1, 4, 3, 3, dtype=torch.long)), "k = 2 experts per token and pi_routed_"),
    (dict(pi_routed_experts=torch.zeros(1, 4, 2, 2, dtype=torch.long)), "has 3 layers and pi_routed_experts 2"),
    (dict(num_experts=0), "num_experts must be an integer in"),
    (dict(num_experts=7), r"mu_routed_experts holds an expert id outside \[-1, 7\) at \(b, t, layer\) = \(0, 2, 1\)"),
    (dict(num_experts=None, mu_routed_experts=torch.tensor([MU]) * 5000), r"outside \[-1, 32768\)"),
    (dict(pi_routed_experts=torch.tensor([PI]).clamp(min=-2) - 1), "pi_routed_experts holds an expert id outside"),
]


@pytest.mark.parametrize("recorder", [TokenRecorder, StagedRecorder])
@pytest.mark.parametrize(("over", "message"), BAD)
def test_bad_routing_is_one_line_and_records_nothing(tmp_path, recorder, over, message):
    with recorder(tmp_path / "run", rules=["ppo"]) as rec:
        with pytest.raises(ValueError, match=message) as err:
            rec.record(0, **_call(**over))
        assert "\n" not in str(err.value)
        rec.record(1, **_call())  # the recorder goes on
    run = load_run(tmp_path / "run")
    assert run.tokens.collect()["step"].unique().to_list() == [1]
    assert run.routing.collect()["step"].unique().to_list() == [1]


def test_mixed_and_one_sided_dense_sets(tmp_path):
    mixed = torch.tensor([MU])
    mixed[0, 1, 1] = torch.tensor([-1, 3])
    one_sided = torch.tensor([PI])
    one_sided[0, 0, 0] = torch.tensor([0, 1])
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        with pytest.raises(ValueError, match=r"mu_routed_experts mixes -1 \(dense\) .* \(0, 1, 1\)"):
            rec.record(0, **_call(mu_routed_experts=mixed))
        with pytest.raises(ValueError, match=r"dense \(-1\) on one side .* \(0, 0, 0\)"):
            rec.record(0, **_call(pi_routed_experts=one_sided))
