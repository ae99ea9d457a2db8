"""The routed experts a verl rollout carries for router replay, as `record`'s routing arguments.

verl's agent loop puts the engine's experts in the batch as `routed_experts` (B, prompt_length +
response_length, L, k), aligned with `input_ids` (left-padded prompt, right-padded response):
the engine's position i sits at column prompt_length − P + i (verl/experimental/agent_loop,
`_InternalAgentLoopOutput.routed_experts`), so response token t, predicted at position P − 1 + t,
reads column prompt_length − 1 + t whatever the prompt's length P. The trainer's own routing is
not in the batch: with `actor.router_replay.mode = "R3"` the trainer routes with these experts
(π's routing is μ's, 0 flips by construction: the record shows the replay at work); in any other
mode the hook has only μ's side and records no routing (`record` compares two sides).
"""

from __future__ import annotations

from typing import Any

import torch


def replays_rollout_routing(actor_config: Any) -> bool:
    """Whether verl's actor replays the rollout's routing (`router_replay.mode` "R3")."""
    replay = getattr(actor_config, "router_replay", None)
    if replay is None and hasattr(actor_config, "get"):
        replay = actor_config.get("router_replay")
    mode = getattr(replay, "mode", None)
    if mode is None and replay is not None and hasattr(replay, "get"):
        mode = replay.get("mode")
    return mode == "R3"


def response_routing(routed_experts: torch.Tensor, response_length: int) -> torch.Tensor:
    """(B, R, L, k) int64: the columns of verl's (B, prompt_length + R, L, k) `routed_experts` that
    predicted each response token (module docstring). ValueError for another shape."""
    if not isinstance(routed_experts, torch.Tensor) or routed_experts.dim() != 4:
        got = tuple(routed_experts.shape) if isinstance(routed_experts, torch.Tensor) else type(routed_experts).__name__
        raise ValueError(f"verl's routed_experts must be (B, prompt_length + response_length, L, k), got {got}")
    prompt_length = routed_experts.shape[1] - response_length
    if prompt_length < 1:
        raise ValueError(
            f"verl's routed_experts has {routed_experts.shape[1]} positions, no prompt before the "
            f"{response_length} response tokens"
        )
    return routed_experts[:, prompt_length - 1 : prompt_length - 1 + response_length].long()


def routing_args(batch: Any, actor_config: Any, response_length: int) -> dict[str, torch.Tensor]:
    """`record`'s mu_routed_experts and pi_routed_experts from a verl micro-batch that carries
    `routed_experts` under R3 replay; {} otherwise."""
    experts = batch.get("routed_experts") if hasattr(batch, "get") else None
    if experts is None or not replays_rollout_routing(actor_config):
        return {}
    mu = response_routing(experts, response_length)
    return {"mu_routed_experts": mu, "pi_routed_experts": mu}
