"""The routed experts verl's rollout carries for router replay (issue 49.3), without verl: the
batch's `routed_experts` built the way verl's agent loop builds it (a zero (1, prompt_length +
response_length, L, k) tensor, the engine's [P + n − 1, L, k] rows written from column
prompt_length − P: verl/experimental/agent_loop/agent_loop.py `_agent_loop_postprocess`), read
back as the experts that predicted each response token."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trustlens.integrations.verl.routing import replays_rollout_routing, response_routing, routing_args

PROMPT_LENGTH, RESPONSE_LENGTH, L, K = 5, 4, 2, 2


def agent_loop_batch(prompts: list[int], responses: list[int]) -> torch.Tensor:
    """Each sample's engine rows (position p: experts p·10, p·10 + 1 at layer 1; layer 0 dense)."""
    out = []
    for p, n in zip(prompts, responses, strict=True):
        engine = torch.full((p + n - 1, L, K), -1, dtype=torch.int32)
        engine[:, 1] = torch.stack([torch.arange(p + n - 1) * 10, torch.arange(p + n - 1) * 10 + 1], -1)
        routed = torch.zeros(1, PROMPT_LENGTH + RESPONSE_LENGTH, L, K, dtype=torch.int32)
        start = PROMPT_LENGTH - p  # left padding: the prompt ends at column PROMPT_LENGTH
        routed[:, start : start + len(engine)] = engine.unsqueeze(0)
        out.append(routed)
    return torch.cat(out)


def test_response_tokens_read_the_position_that_predicted_them():
    batch = agent_loop_batch([3, 5], [4, 2])
    got = response_routing(batch, RESPONSE_LENGTH)
    assert got.shape == (2, RESPONSE_LENGTH, L, K) and got.dtype == torch.long
    # sample 0: P = 3, token t predicted at position 2 + t; sample 1: P = 5, at 4 + t
    assert got[0, :, 1, 0].tolist() == [20, 30, 40, 50]
    assert got[1, :2, 1, 0].tolist() == [40, 50]
    assert (got[0, :, 0] == -1).all() and (got[1, :2, 0] == -1).all()
    assert (got[1, 2:] == 0).all()  # verl's padding is 0, not −1: the response mask leaves it out


def test_routing_args_under_r3_only():
    batch = {"routed_experts": agent_loop_batch([3], [4])}
    r3 = SimpleNamespace(router_replay=SimpleNamespace(mode="R3"))
    args = routing_args(batch, r3, RESPONSE_LENGTH)
    assert args["mu_routed_experts"] is args["pi_routed_experts"]
    assert args["mu_routed_experts"][0, :, 1, 0].tolist() == [20, 30, 40, 50]
    assert routing_args(batch, {"router_replay": {"mode": "disabled"}}, RESPONSE_LENGTH) == {}
    assert routing_args({}, r3, RESPONSE_LENGTH) == {}
    assert replays_rollout_routing({"router_replay": {"mode": "R3"}})
    assert not replays_rollout_routing(SimpleNamespace())


def test_bad_layout_is_one_line():
    with pytest.raises(ValueError, match=r"must be \(B, prompt_length \+ response_length, L, k\)"):
        response_routing(torch.zeros(2, 9, 2), RESPONSE_LENGTH)
    with pytest.raises(ValueError, match="no prompt before the 9 response tokens"):
        response_routing(torch.zeros(1, 9, 2, 2), 9)
