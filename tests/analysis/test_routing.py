"""Mismatch by routing (issue 49.4): k3 and |Δ log p| on tokens with 0, 1, 2+ flipped layers and
by first flipped layer, the shares the flipped tokens carry, and the exact per-layer flips, on a
run recorded through TokenRecorder with hand-checked values (k3 = e^d − 1 − d, d = log π − log μ
in float64), a hand-built sampled run (weights) and a dense run."""

from __future__ import annotations

import math

import pytest
import torch

from trustlens import TokenRecorder, load_run, plots
from trustlens.routing import (
    flipped_layers,
    flipped_tokens,
    flips_per_layer,
    measured_split,
    mismatch_by_first_flip,
    mismatch_by_flips,
    routing_share,
)
from trustlens.run.tables import write_run

D = [-1, -1]
# t0: 1 flip (layer 2); t1: 2 flips (first layer 1); t2, t3: none (3 layers, layer 0 dense, k = 2)
MU = [[D, [0, 1], [2, 3]], [D, [0, 1], [4, 5]], [D, [6, 7], [0, 7]], [D, [6, 7], [0, 7]]]
PI = [[D, [1, 0], [2, 4]], [D, [2, 3], [5, 6]], [D, [7, 6], [7, 0]], [D, [6, 7], [0, 7]]]
PI_LOGP = [-1.0, -2.0, -0.5, -0.3]
MU_LOGP = [-1.5, -1.0, -0.6, -0.3]
DLOGP = [p - m for p, m in zip(PI_LOGP, MU_LOGP, strict=True)]  # 0.5, -1, 0.1, 0
K3 = [math.exp(d) - 1 - d for d in DLOGP]


@pytest.fixture
def run(tmp_path):
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        for update in (0, 1):  # update 1's rows are π after an update: not read
            rec.record(
                0,
                update=update,
                token_ids=torch.tensor([[1, 2, 3, 4]]),
                response_mask=torch.ones(1, 4),
                pi_logp=torch.tensor([PI_LOGP]) - 3.0 * update,
                mu_logp=torch.tensor([MU_LOGP]),
                advantages=torch.ones(1),
                mu_routed_experts=torch.tensor([MU]),
                pi_routed_experts=torch.tensor([PI]),
            )
    return load_run(tmp_path / "run")


def test_mismatch_by_flips(run):
    got = mismatch_by_flips(run)
    total_k3, total_d = sum(K3), sum(abs(d) for d in DLOGP)
    assert got["flipped"].to_list() == ["0", "1", "2+"]
    assert got["tokens"].to_list() == [2.0, 1.0, 1.0]
    assert got["token_share"].to_list() == [0.5, 0.25, 0.25]
    expected_k3 = [(K3[2] + K3[3]) / 2, K3[0], K3[1]]
    assert got["k3_mean"].to_list() == pytest.approx(expected_k3, rel=1e-5)
    assert got["dlogp_mean"].to_list() == pytest.approx([0.05, 0.5, 1.0], rel=1e-5)
    assert got["k3_share"].to_list() == pytest.approx([(K3[2] + K3[3]) / total_k3, K3[0] / total_k3, K3[1] / total_k3])
    assert got["dlogp_share"].to_list() == pytest.approx([0.1 / total_d, 0.5 / total_d, 1.0 / total_d], rel=1e-5)


def test_mismatch_by_first_flip(run):
    got = mismatch_by_first_flip(run)
    assert got["layer"].to_list() == [1, 2, None]
    assert got["tokens"].to_list() == [1.0, 1.0, 2.0]
    assert got["k3_mean"].to_list() == pytest.approx([K3[1], K3[0], (K3[2] + K3[3]) / 2], rel=1e-5)


def test_routing_share(run):
    share = routing_share(run)
    total_k3 = sum(K3)
    assert share.tokens == 4 and share.flipped_share == 0.5
    assert share.k3_share == pytest.approx((K3[0] + K3[1]) / total_k3, rel=1e-5)
    # above the unflipped tokens' mean k3 (K3[2] + K3[3]) / 2, carried by the 2 flipped tokens
    assert share.k3_excess_share == pytest.approx((K3[0] + K3[1] - (K3[2] + K3[3])) / total_k3, rel=1e-5)
    assert share.dlogp_share == pytest.approx(1.5 / 1.6, rel=1e-5)
    assert share.dlogp_excess_share == pytest.approx((1.5 - 2 * 0.05) / 1.6, rel=1e-5)
    assert share.k3_flipped == pytest.approx((K3[0] + K3[1]) / 2, rel=1e-5)
    assert share.k3_unflipped == pytest.approx((K3[2] + K3[3]) / 2, rel=1e-5)


def test_flips_per_layer_are_exact_counts(run):
    got = flips_per_layer(run)  # both updates' rows: 8 tokens per layer
    assert got.select("step", "layer", "tokens", "flips").rows() == [(0, 1, 8, 2), (0, 2, 8, 4)]
    assert got["flip_rate"].to_list() == [0.25, 0.5]
    assert got["overlap_mean"].to_list() == [0.75, 0.75]  # layer 1: (1 + 0 + 1 + 1)/4, layer 2: (½ + ½ + 1 + 1)/4
    assert flipped_layers(run, top=1) == [{"layer": 2, "tokens": 8, "flips": 4, "flip_rate": 0.5}]


def test_weighted_rows_of_a_sampled_run(tmp_path):
    # a flipped token kept at weight 1 and an unflipped one standing for 9 tokens
    write_run(
        tmp_path / "run",
        tokens={
            "step": [0, 0],
            "sample": [0, 0],
            "pos": [0, 1],
            "pi_logp": [-1.0, -1.0],
            "mu_logp": [-2.0, -1.1],
            "weight": [1.0, 9.0],
            "route_flips": [1, 0],
            "route_first_flip": [3, None],
        },
    )
    share = routing_share(load_run(tmp_path / "run"))
    k3 = [math.exp(1.0) - 2.0, math.exp(0.1) - 1.1]
    assert share.tokens == 10 and share.flipped_share == pytest.approx(0.1)
    assert share.k3_share == pytest.approx(k3[0] / (k3[0] + 9 * k3[1]), rel=1e-5)
    assert share.k3_excess_share == pytest.approx((k3[0] - k3[1]) / (k3[0] + 9 * k3[1]), rel=1e-5)


def test_dense_run(tmp_path):
    run = _dense(tmp_path)
    assert routing_share(run) is None
    assert mismatch_by_flips(run).is_empty() and flips_per_layer(run).is_empty()
    assert flipped_layers(run) == []


def test_flips_per_layer_needs_a_run(run):
    with pytest.raises(TypeError, match="flips_per_layer: run must be a Run"):
        flips_per_layer(run.tokens)


def test_measured_split_weights_each_step_by_its_tokens(tmp_path):
    """Two steps of the shadow forward's means, 4 and 1 response tokens: Σ|routing| = 4·0.2 + 0.6,
    Σ|residual| = 4·0.2 + 0.2; k3 under the trainer's own routing 4·1 + 2, under μ's 4·0.5 + 2.
    Step 2 logged only part of the four metrics and step 3 none: neither counts."""
    split = {0: (0.2, 0.2, 1.0, 0.5), 1: (0.6, 0.2, 2.0, 2.0), 2: (0.1, 0.1, None, None)}
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        for step, tokens in ((0, 4), (1, 1), (2, 2), (3, 2)):
            rec.record(
                step,
                token_ids=torch.ones(1, tokens, dtype=torch.long),
                response_mask=torch.ones(1, tokens),
                pi_logp=torch.full((1, tokens), -1.0),
                mu_logp=torch.full((1, tokens), -1.0),
                advantages=torch.ones(1),
            )
            names = (
                "routing/abs_dlogp_routing",
                "routing/abs_dlogp_residual",
                "routing/k3_live",
                "routing/k3_replayed",
            )
            values = split.get(step, ())
            rec.log_metrics(step, {n: v for n, v in zip(names, values, strict=False) if v is not None})
    got = measured_split(load_run(tmp_path / "run"))
    assert got is not None and (got.steps, got.tokens) == (2, 5.0)
    assert got.dlogp_share == pytest.approx((0.8 + 0.6) / (0.8 + 0.6 + 0.8 + 0.2), rel=1e-12)
    assert got.k3_share == pytest.approx(1 - 4.0 / 6.0, rel=1e-12)


def test_measured_split_of_a_run_without_one(run):
    assert measured_split(run) is None
    with pytest.raises(TypeError, match="measured_split: run must be a Run"):
        measured_split(run.tokens)


def test_flipped_tokens_of_a_response(run):
    got = flipped_tokens(run.tokens.filter(step=0, update=0).sort("pos").collect())
    assert got["pos"].to_list() == [0, 1]
    assert got["route_flips"].to_list() == [1, 2]
    assert got["experts"].to_list() == ["2: μ [2, 3] → π [2, 4]", "1: μ [0, 1] → π [2, 3]; 2: μ [4, 5] → π [5, 6]"]


def test_flips_heatmap(run, tmp_path):
    fig = plots.routing_flips_heatmap(flips_per_layer(run))
    (heat,) = fig.data
    assert list(heat.y) == [1, 2] and [list(z) for z in heat.z] == [[0.25], [0.5]]
    assert "no routing recorded" in str(plots.routing_flips_heatmap(flips_per_layer(_dense(tmp_path))).layout)


def _dense(tmp_path):
    with TokenRecorder(tmp_path / "dense", rules=["ppo"]) as rec:
        rec.record(
            0,
            token_ids=torch.tensor([[1]]),
            response_mask=torch.ones(1, 1),
            pi_logp=torch.tensor([[-1.0]]),
            mu_logp=torch.tensor([[-1.5]]),
            advantages=torch.ones(1),
        )
    return load_run(tmp_path / "dense")
