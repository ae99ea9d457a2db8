"""The routed experts verl's rollout carries for router replay (issue 49.3), without verl: the
micro-batch `ppo_loss` gets on verl 0.9.1's engine workers, built the way verl builds it
(file:line in verl/, as trustlens.integrations.verl.routing's docstring):
- `RayPPOTrainer`: the agent loop's zero (1, prompt_length + response_length, L, k) tensor per
  sample with the engine's [P + n − 1, L, k] rows from column prompt_length − P
  (experimental/agent_loop/agent_loop.py:783-809), concatenated (:1074-1075), then unpadded by the
  attention mask into the jagged layout of `input_ids` (`left_right_2_no_padding`,
  workers/utils/padding.py:56-79);
- the v1 `PPOTrainer`: per sample (P + n, L, k), the engine's rows first, zero after
  (agent_loop.py:129-141), jagged across samples (utils/tensordict_utils.py:933-946), next to
  jagged `input_ids` = prompt ‖ response and jagged `prompts` / `responses`
  (trainer/ppo/v1/agent_loop_tq.py:183-199).
Position p of a sample with a P-token prompt: experts p·10, p·10 + 1 at layer 1; at layer 0,
p·10 + 2, p·10 + 3 where the token it predicts (t = p − P + 1) is odd, dense (−1) elsewhere."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trustlens import TokenRecorder, load_run
from trustlens.integrations.verl.routing import replay_mode, response_routing, routing_args
from trustlens.integrations.verl.workers import _engine_sequences

PROMPT_LENGTH, RESPONSE_LENGTH, L, K = 5, 4, 2, 2
PROMPTS, RESPONSES = [3, 5, 2], [4, 2, 3]  # each sample's prompt and response tokens


def engine_rows(p: int, n: int) -> torch.Tensor:
    """The engine's (P + n − 1, L, K) experts: the positions that predicted a token."""
    pos = torch.arange(p + n - 1)
    rows = torch.full((p + n - 1, L, K), -1, dtype=torch.long)
    rows[:, 1] = torch.stack([pos * 10, pos * 10 + 1], -1)
    odd = (pos - p + 1) % 2 == 1
    rows[odd, 0] = torch.stack([pos[odd] * 10 + 2, pos[odd] * 10 + 3], -1)
    return rows


def expected(p: int, n: int) -> list[list[list[int]]]:
    """What the token t of a sample must read: the experts of position P − 1 + t."""
    pos = [p - 1 + t for t in range(n)]
    return [[[q * 10 + 2, q * 10 + 3] if t % 2 else [-1, -1], [q * 10, q * 10 + 1]] for t, q in enumerate(pos)]


def jagged(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(parts, layout=torch.jagged)


def rayppo_micro_batch() -> dict:
    """RayPPOTrainer's micro-batch: padded `prompts` / `responses` / `attention_mask`, jagged
    `input_ids` and `routed_experts` (the latter two unpadded by the attention mask)."""
    width = PROMPT_LENGTH + RESPONSE_LENGTH
    input_ids = torch.zeros(len(PROMPTS), width, dtype=torch.long)
    attention = torch.zeros(len(PROMPTS), width, dtype=torch.long)
    routed = []
    for b, (p, n) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        start = PROMPT_LENGTH - p  # left padding: the prompt ends at column PROMPT_LENGTH
        input_ids[b, start : PROMPT_LENGTH + n] = torch.arange(1, p + n + 1)
        attention[b, start : PROMPT_LENGTH + n] = 1
        sample = torch.zeros(1, width, L, K, dtype=torch.int16)
        rows = engine_rows(p, n)
        sample[:, start : start + len(rows)] = rows.to(torch.int16).unsqueeze(0)
        routed.append(sample)
    routed_experts = torch.cat(routed)
    valid = attention.bool()
    return {
        "input_ids": jagged([input_ids[b, valid[b]] for b in range(len(PROMPTS))]),
        "prompts": input_ids[:, :PROMPT_LENGTH],
        "responses": input_ids[:, PROMPT_LENGTH:],
        "attention_mask": attention,
        "response_mask": attention[:, PROMPT_LENGTH:],
        "routed_experts": jagged([routed_experts[b, valid[b]] for b in range(len(PROMPTS))]),
    }


def v1_micro_batch() -> dict:
    """The v1 trainer's micro-batch: every per-sample column jagged."""
    prompts = [torch.arange(1, p + 1) for p in PROMPTS]
    responses = [torch.arange(p + 1, p + n + 1) for p, n in zip(PROMPTS, RESPONSES, strict=True)]
    routed = []
    for p, n in zip(PROMPTS, RESPONSES, strict=True):
        aligned = torch.zeros(p + n, L, K, dtype=torch.int16)  # as_dict: the whole sequence's rows
        rows = engine_rows(p, n)
        aligned[: len(rows)] = rows.to(torch.int16)
        routed.append(aligned)
    return {
        "input_ids": jagged([torch.cat(pr) for pr in zip(prompts, responses, strict=True)]),
        "prompts": jagged(prompts),
        "responses": jagged(responses),
        "response_mask": jagged([torch.ones(n, dtype=torch.long) for n in RESPONSES]),
        "routed_experts": jagged(routed),
    }


def megatron_actor(mode: str) -> SimpleNamespace:
    """verl 0.9's McoreActorConfig as ppo_loss gets it: the engine config holds the replay mode."""
    return SimpleNamespace(strategy="megatron", engine=SimpleNamespace(router_replay=SimpleNamespace(mode=mode)))


@pytest.mark.parametrize("build", [rayppo_micro_batch, v1_micro_batch])
def test_response_tokens_read_the_rows_that_predicted_them(build):
    data = build()
    width = max(RESPONSES)
    _, prompt_lengths, _ = _engine_sequences(data, (len(PROMPTS), width))
    assert prompt_lengths == PROMPTS
    args = routing_args(data, "R3", prompt_lengths, width)
    mu = args["mu_routed_experts"]
    assert args["pi_routed_experts"] is mu and mu.shape == (3, width, L, K) and mu.dtype == torch.long
    for b, (p, n) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        assert mu[b, :n].tolist() == expected(p, n)
        assert (mu[b, n:] == 0).all()  # beyond the response: 0, which the response mask leaves out


def test_replay_mode_is_the_engine_s_where_verl_marks_the_batch():
    assert replay_mode(megatron_actor("R3"), marked=True) == "R3"
    assert replay_mode(megatron_actor("R2"), marked=True) == "R2"
    assert replay_mode(megatron_actor("R3"), marked=False) == "disabled"  # the FSDP engine: never marked
    section = {"strategy": "veomni", "veomni": {"router_replay": {"mode": "R3"}}}  # OmegaConf-like
    assert replay_mode(section, marked=True) == "R3"
    # verl 0.7's actor config names a mode at its top, which its FSDP DataParallelPPOActor ignores
    assert replay_mode(SimpleNamespace(strategy="fsdp", router_replay=SimpleNamespace(mode="R3")), True) == "disabled"


def test_only_r3_records_routing():
    data = v1_micro_batch()
    for mode in ("R2", "disabled"):  # R2: routed_experts is π_old's routing, μ's is in no batch
        assert routing_args(data, mode, PROMPTS, 4) == {}
    assert routing_args({k: v for k, v in data.items() if k != "routed_experts"}, "R3", PROMPTS, 4) == {}


def test_an_r3_micro_batch_records_zero_flips(tmp_path):
    """A tiny run: the micro-batch recorded as the engine hook records it under R3."""
    data = rayppo_micro_batch()
    _, prompt_lengths, responses = _engine_sequences(data, tuple(data["response_mask"].shape))
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        rec.record(
            1,
            token_ids=responses,
            response_mask=data["response_mask"],
            pi_logp=torch.full(responses.shape, -0.4),
            mu_logp=torch.full(responses.shape, -0.5),
            advantages=torch.ones(len(PROMPTS)),
            **routing_args(data, "R3", prompt_lengths, responses.shape[1]),
        )
    run = load_run(tmp_path / "run")
    rows = run.tokens.collect()
    assert len(rows) == sum(RESPONSES)
    assert rows["route_flips"].to_list() == [0] * sum(RESPONSES)
    assert rows["route_first_flip"].null_count() == sum(RESPONSES)
    assert rows["route_overlap"].to_list() == [1.0] * sum(RESPONSES)
    table = run.routing.sort("layer").collect()
    odd = sum(n // 2 for n in RESPONSES)  # layer 0 is an MoE layer at the odd tokens only
    assert table["tokens"].to_list() == [odd, sum(RESPONSES)] and table["flips"].to_list() == [0, 0]
    assert table["overlap"].to_list() == [odd, sum(RESPONSES)]


def test_bad_layout_is_one_line():
    with pytest.raises(ValueError, match=r"must be \(B, prompt \+ response positions, L, k\), got \(2, 9, 2\)"):
        response_routing(torch.zeros(2, 9, 2), [9, 9], [5, 5], 4)
    with pytest.raises(ValueError, match="sample 0 has 5 rows for 5 prompt and 4 response tokens"):
        response_routing(jagged([torch.zeros(5, 2, 2)]), [9], [5], 4)
    with pytest.raises(ValueError, match="2 samples for a micro-batch of 1"):
        response_routing(torch.zeros(2, 9, 2, 2), [9], [5], 4)
