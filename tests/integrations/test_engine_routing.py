"""Routed experts from the engines (issue 49.3) against outputs built the way the engines build
them:
- vLLM: `CompletionOutput.routed_experts`, an int array [seq_len, layers, top_k]
  (vllm-project/vllm vllm/outputs.py at 003d3ee22261b7937258b7531aee00e10393f1d6), with
  seq_len = request.num_tokens − 1, prompt and output positions by slot
  (vllm/v1/core/sched/scheduler.py `_get_routed_experts` at 00024d314514900f361ad072af6931e403b7f589);
- SGLang: `meta_info["routed_experts"]`, base64 of the int32 bytes of [rows, layers, top_k]
  (tokenizer_manager: pybase64.b64encode(val.numpy().tobytes())), covering positions
  [routed_experts_start_len, seqlen − 1) (python/sglang/srt/managers/io_struct.py GenerateReqInput),
  meta_info["prompt_tokens"] the prompt's length.
Position p's experts are p·10 + slot at layer 1; layer 0 is dense (−1). Output token t was
predicted at position P − 1 + t."""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from test_engines import Logprob

from trustlens import TokenRecorder, load_run
from trustlens.integrations.engines import from_sglang, from_vllm

P, L, K = 3, 2, 2  # prompt tokens, layers, top_k


def positions(first: int, end: int) -> np.ndarray:
    """The engines' [end − first, L, K] experts of positions first … end − 1."""
    rows = np.full((end - first, L, K), -1, np.int32)
    for i, p in enumerate(range(first, end)):
        rows[i, 1] = [p * 10, p * 10 + 1]
    return rows


def expected(n: int) -> list:
    return [[[-1, -1], [(P - 1 + t) * 10, (P - 1 + t) * 10 + 1]] for t in range(n)]


@dataclass
class CompletionOutput:  # vllm.outputs.CompletionOutput (003d3ee): routed_experts after logprobs
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    routed_experts: np.ndarray | None = None  # [seq_len, layer_num, topk]
    finish_reason: str | None = None


@dataclass
class RequestOutput:  # vllm.outputs.RequestOutput
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: list | None
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True


def vllm_output(ids: list[int], routed: np.ndarray | None) -> RequestOutput:
    logprobs = [{i: Logprob(-0.5, 1)} for i in ids]
    completion = CompletionOutput(0, "", ids, None, logprobs, routed_experts=routed)
    return RequestOutput("r", None, [7] * P, None, [completion])


def sglang_response(ids: list[int], routed, start: int | None = None) -> dict:
    meta = {"output_token_logprobs": [[-0.5, i, None] for i in ids], "prompt_tokens": P, "completion_tokens": len(ids)}
    if routed is not None:
        meta["routed_experts"] = routed
    if start is not None:
        meta["routed_experts_start_len"] = start
    return {"text": "", "output_ids": ids, "meta_info": meta}


def b64(rows: np.ndarray) -> str:
    return base64.b64encode(rows.astype("<i4").tobytes()).decode("utf-8")


def test_vllm_routed_experts_of_the_output_tokens():
    outputs = [vllm_output([1, 2, 3, 4], positions(0, P + 4 - 1)), vllm_output([5, 6], positions(0, P + 2 - 1))]
    tokens = from_vllm(outputs)
    got = tokens.mu_routed_experts
    assert got.shape == (2, 4, L, K) and got.dtype == torch.long
    assert got[0].tolist() == expected(4)
    assert got[1, :2].tolist() == expected(2) and (got[1, 2:] == -1).all()  # padding
    assert tokens.record_args()["mu_routed_experts"] is got


def test_vllm_without_routed_experts_and_bare_completions():
    assert from_vllm([vllm_output([1, 2], None)]).mu_routed_experts is None
    bare = vllm_output([1, 2, 3], positions(0, P + 2)).outputs  # no prompt known: the last 3 rows
    assert from_vllm(bare).mu_routed_experts[0].tolist() == expected(3)


@pytest.mark.parametrize("form", ["base64", "nested"])
@pytest.mark.parametrize("start", [0, 2])
def test_sglang_routed_experts_with_a_start_offset(form, start):
    rows = positions(start, P + 3 - 1)
    payload = b64(rows) if form == "base64" else rows.tolist()
    tokens = from_sglang(
        [sglang_response([1, 2, 3], payload)], routed_experts_shape=(L, K), routed_experts_start_len=start
    )
    assert tokens.mu_routed_experts[0].tolist() == expected(3)
    kept = from_sglang([sglang_response([1, 2, 3], payload, start=start)], routed_experts_shape=(L, K))
    assert kept.mu_routed_experts[0].tolist() == expected(3)  # a proxy that kept the offset in meta_info


BAD_SGLANG = [
    (dict(payload=b64(positions(0, P + 2))), {}, r"pass routed_experts_shape=\(num_layers, top_k\)"),
    (dict(payload="not base64!"), dict(routed_experts_shape=(L, K)), "not base64 of int32"),
    (dict(payload=b64(positions(0, P + 1))), dict(routed_experts_shape=(L, K)), "hold 4 positions; a prompt of 3"),
    (dict(payload=b64(positions(0, P + 2))), dict(routed_experts_shape=(3, 1)), "do not fill rows of 3 × 1"),
    (dict(payload=b64(positions(P, P + 2))), dict(routed_experts_shape=(L, K), routed_experts_start_len=P), "fewer"),
    (dict(payload=positions(0, P + 2).tolist()), dict(routed_experts_shape=(L, 3)), "not \\(2, 3\\)"),
    (dict(payload=positions(0, P + 2).astype(float).tolist()), {}, "integer expert ids"),
]


@pytest.mark.parametrize(("given", "kwargs", "message"), BAD_SGLANG)
def test_bad_sglang_routing_names_the_response(given, kwargs, message):
    with pytest.raises(ValueError, match=f"response 0: .*{message}"):
        from_sglang([sglang_response([1, 2, 3], given["payload"])], **kwargs)


def test_bad_vllm_routing():
    with pytest.raises(ValueError, match="response 0: routed experts hold 4 positions; a prompt of 3 tokens and 3"):
        from_vllm([vllm_output([1, 2, 3], positions(0, 4))])
    with pytest.raises(ValueError, match="response 1 has no routed experts while others have"):
        from_vllm([vllm_output([1], positions(0, P)), vllm_output([1], None)])
    other = np.full((P, 3, K), -1, np.int32)
    with pytest.raises(ValueError, match="differ in layers × top_k"):
        from_vllm([vllm_output([1], positions(0, P)), vllm_output([1], other)])


def test_engine_routing_becomes_route_columns(tmp_path):
    tokens = from_vllm([vllm_output([1, 2, 3, 4], positions(0, P + 3))])
    pi = tokens.mu_routed_experts.clone()
    pi[0, 1, 1] = torch.tensor([35, 30])  # the trainer routes token 1 to {30, 35}, the engine to {30, 31}
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        rec.record(
            0,
            **tokens.record_args(),
            pi_logp=torch.full((1, 4), -0.4),
            advantages=torch.ones(1),
            pi_routed_experts=pi,
            num_experts=64,
        )
    rows = load_run(tmp_path / "run").tokens.sort("pos").collect()
    assert rows["route_flips"].to_list() == [0, 1, 0, 0]
    assert rows["route_first_flip"].to_list() == [None, 1, None, None]
    assert rows["route_overlap"].to_list() == [1.0, 0.5, 1.0, 1.0]
    assert rows["route_mu_experts"][1].to_list() == [30, 31] and rows["route_pi_experts"][1].to_list() == [30, 35]
    assert math.isclose(rows["mu_logp"][0], -0.5)
