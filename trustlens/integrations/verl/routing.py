"""The routed experts a verl rollout carries for router replay, as `record`'s routing arguments.

Where they travel (verl 0.9.1's source; file:line in verl/):
- The rollout returns them with `actor_rollout_ref.rollout.enable_rollout_routing_replay=True`
  (vLLM: workers/rollout/vllm_rollout/vllm_async_server.py:437-451, 715-717; SGLang:
  workers/rollout/sglang_rollout/async_sglang_server.py:404, 681-697): the engine's
  [P + n − 1, L, k] experts of the positions that predicted a token, row i the position i.
- The agent loop puts them in the batch as `routed_experts`, int16. `RayPPOTrainer`
  (`trainer.use_v1=False`): (B, prompt_length + response_length, L, k) aligned with `input_ids`,
  the engine's row i at column prompt_length − P + i, zero elsewhere
  (experimental/agent_loop/agent_loop.py:783-809, 1074-1075); its `_update_actor` unpads the
  batch by the attention mask with `left_right_2_no_padding` (trainer/ppo/ray_trainer.py:1333-1335,
  workers/utils/padding.py:73-79). verl 0.9's default v1 `PPOTrainer`: per sample (P + n, L, k),
  row i the position i, rows the engine did not record zero (agent_loop.py:129-141
  `AgentLoopOutput.as_dict`, trainer/ppo/v1/agent_loop_tq.py:194), jagged across samples
  (utils/tensordict_utils.py:933-946).
- Either way `ppo_loss`'s micro-batch holds `routed_experts` jagged (B, P_b + n_b, L, k) in the
  layout of its no-padding `input_ids`: sample b's row i is its position i, prompt then response
  (the Megatron engine reads it from the very micro-batch the loss gets,
  workers/engine/megatron/transformer_impl.py:1178, 1447). Response token t, predicted at
  position P_b − 1 + t, reads row P_b − 1 + t: the rows verl reads log π from
  (padding.py `no_padding_2_padding`).

What the trainer does with them: the mode is the actor engine's `router_replay.mode`
(`actor.megatron.router_replay` or `actor.veomni.router_replay`, the actor config's `engine`).
Only those two engines replay: their worker marks the batches it trains on
`enable_routing_replay` (workers/engine_workers.py:62-72, 496-503, 710-716); the FSDP engine
never replays.
- R3: the update routes with the rollout's experts at every position that predicts a response
  token (Megatron: utils/megatron/router_replay_utils.py:380-431, transformer_impl.py:1306-1317,
  the final row left native; VeOmni: workers/engine/veomni/transformer_impl.py:434-440, 906-921).
  π's routing is μ's: both sides are recorded from `routed_experts`, 0 flips by construction (the
  record shows the replay at work).
- R2: the old-log-prob pass records the trainer's own routing (Megatron transformer_impl.py:923-
  958, 1016-1019; VeOmni :436-438, 936-941) and the trainer puts it in the batch under the same
  name, `routed_experts` (ray_trainer.py:1308-1320; the v1 trainer writes the worker's output to
  TransferQueue); the update replays it. A rollout's routing cannot ride along (ray_trainer.py:
  1602-1609 refuses both), so the batch holds π_old's routing and not μ's: nothing is recorded.
- disabled, or an unmarked batch (the FSDP engine): the trainer routes natively and its routing
  is in no batch; only μ's side is known, and nothing is recorded (`record` compares two sides).
- verl 0.7's legacy FSDP `DataParallelPPOActor` has no router replay (verl 0.7.1 replays only in
  its Megatron actor, workers/actor/megatron_actor.py:182) and its `update_policy` keeps no
  `routed_experts` (its select_keys, workers/actor/dp_actor.py:516-535): nothing is recorded.
"""

from __future__ import annotations

from typing import Any

import torch


def _field(config: Any, name: str) -> Any:
    """`config.name` of a verl dataclass config or `config[name]` of a mapping; None if absent."""
    value = getattr(config, name, None)
    if value is None and hasattr(config, "get"):
        value = config.get(name)
    return value


def replay_mode(actor_config: Any, marked: bool) -> str:
    """The router replay verl's engine applies to a training micro-batch: the actor engine's
    `router_replay.mode` ("R2", "R3") where the worker `marked` the batch `enable_routing_replay`,
    else "disabled" (module docstring)."""
    engine = _field(actor_config, "engine")
    if engine is None:  # an OmegaConf actor section: the engine config sits under the strategy
        engine = _field(actor_config, str(_field(actor_config, "strategy")))
    mode = _field(_field(engine, "router_replay"), "mode")
    return str(mode) if marked and mode is not None else "disabled"


def response_routing(
    routed_experts: torch.Tensor, seq_lengths: list[int], prompt_lengths: list[int], width: int
) -> torch.Tensor:
    """(B, width, L, k) int64: the rows of an engine micro-batch's jagged (B, P_b + n_b, L, k)
    `routed_experts` that predicted each response token (row P_b − 1 + t for token t < n_b, with
    n_b = seq_lengths[b] − P_b; 0 beyond). A dense (B, S, L, k) tensor is read as S rows of every
    sample. ValueError for another layout."""
    layout = "verl's routed_experts must be (B, prompt + response positions, L, k)"
    if not isinstance(routed_experts, torch.Tensor) or routed_experts.dim() != 4:
        got = tuple(routed_experts.shape) if isinstance(routed_experts, torch.Tensor) else type(routed_experts).__name__
        raise ValueError(f"{layout}, got {got}")
    rows = list(routed_experts.unbind())
    if len(rows) != len(seq_lengths):
        raise ValueError(f"{layout}: {len(rows)} samples for a micro-batch of {len(seq_lengths)}")
    out = torch.zeros(len(rows), width, *rows[0].shape[1:], dtype=torch.long, device=rows[0].device)
    for b, (sample, seq, prompt) in enumerate(zip(rows, seq_lengths, prompt_lengths, strict=True)):
        if prompt < 1 or not seq - 1 <= sample.shape[0] <= seq:
            raise ValueError(
                f"{layout}: sample {b} has {sample.shape[0]} rows for {prompt} prompt and "
                f"{seq - prompt} response tokens (verl replays {seq} or {seq - 1})"
            )
        out[b, : seq - prompt] = sample[prompt - 1 : seq - 1]
    return out


def routing_args(data: Any, mode: str, prompt_lengths: list[int], width: int) -> dict[str, torch.Tensor]:
    """`record`'s mu_routed_experts and pi_routed_experts, (B, width, L, k), from an engine
    micro-batch `data` (no-padding `input_ids`, `routed_experts`) trained under R3 replay; {}
    otherwise (module docstring)."""
    experts = data.get("routed_experts", None) if hasattr(data, "get") else None
    if experts is None or mode != "R3":
        return {}
    seq_lengths = data["input_ids"].offsets().diff().tolist()
    mu = response_routing(experts, seq_lengths, prompt_lengths, width)
    return {"mu_routed_experts": mu, "pi_routed_experts": mu}
