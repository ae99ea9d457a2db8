"""trustlens.integrations.engines against outputs shaped exactly as the engines document them
(faithful fixtures: the engines are not importable here; test_engines_cases.py follows their code):
vLLM's RequestOutput / CompletionOutput / Logprob (vllm/outputs.py, vllm/logprobs.py: same field
names, as dataclasses) and SGLang's /generate JSON (meta_info.output_token_logprobs as
[logprob, token_id, text], output_top_logprobs per position)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import polars as pl
import pytest
import torch

import trustlens
from trustlens.integrations.engines import from_sglang, from_vllm, sglang_sampling, vllm_sampling

V, K = 12, 3  # vocabulary and the top-K asked of the engine


@dataclass
class Logprob:  # vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:  # vllm.outputs.CompletionOutput
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:  # vllm.outputs.RequestOutput
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: list | None
    outputs: list[CompletionOutput]
    finished: bool = True
    metrics: object = None
    lora_request: object = None
    encoder_prompt: str | None = None
    encoder_prompt_token_ids: list[int] | None = None
    num_cached_tokens: int | None = None
    kv_transfer_params: dict = field(default_factory=dict)


def engine_draws(lengths: list[int], seed: int = 0):
    """Per response: sampled ids and the float64 log-softmax of each position (T_b, V)."""
    gen = torch.Generator().manual_seed(seed)
    draws = []
    for n in lengths:
        logp = torch.log_softmax(torch.randn(n, V, generator=gen, dtype=torch.float64) * 2, -1)
        ids = torch.multinomial(logp.exp(), 1, generator=gen)[:, 0]
        draws.append((ids.tolist(), logp))
    return draws


def vllm_position(token: int, logp: torch.Tensor, k: int = K) -> dict[int, Logprob]:
    """What vLLM returns at a position with SamplingParams(logprobs=k): the k most likely ids and
    the sampled one, each with its rank (1 = most likely)."""
    order = logp.argsort(descending=True).tolist()
    rank = {i: r + 1 for r, i in enumerate(order)}
    return {i: Logprob(float(logp[i]), rank[i], f"t{i}") for i in [*order[:k], token]}


def vllm_outputs(draws, n_per_request: int = 2) -> list[RequestOutput]:
    completions = [
        CompletionOutput(
            index=i % n_per_request,
            text=" ".join(f"t{i}" for i in ids),
            token_ids=ids,
            cumulative_logprob=float(sum(logp[t, a] for t, a in enumerate(ids))),
            logprobs=[vllm_position(a, logp[t]) for t, a in enumerate(ids)],
            finish_reason="stop",
        )
        for i, (ids, logp) in enumerate(draws)
    ]
    return [
        RequestOutput(f"req-{r}", "p", [1, 2], None, completions[r : r + n_per_request])
        for r in range(0, len(completions), n_per_request)
    ]


def sglang_response(ids: list[int], logp: torch.Tensor, k: int = K) -> dict:
    """SGLang /generate JSON with return_logprob=true, top_logprobs_num=k."""
    top = []
    for t in range(len(ids)):
        order = logp[t].argsort(descending=True)[:k].tolist()
        top.append([[float(logp[t, i]), i, None] for i in order])
    return {
        "text": " ".join(f"t{i}" for i in ids),
        "output_ids": ids,
        "meta_info": {
            "id": "abc",
            "finish_reason": {"type": "stop", "matched": 2},
            "prompt_tokens": 2,
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "input_token_logprobs": [[None, 1, None], [-1.2, 2, None]],
            "output_token_logprobs": [[float(logp[t, a]), a, None] for t, a in enumerate(ids)],
            "input_top_logprobs": [None, [[-1.2, 2, None]]],
            "output_top_logprobs": top,
        },
    }


def expected(draws, T: int):
    """Reference tensors: log μ of the sampled ids and μ's top-K with the sampled id forced in."""
    B = len(draws)
    mu = torch.zeros(B, T, dtype=torch.float64)
    top_ids = torch.zeros(B, T, K, dtype=torch.long)
    top_logp = torch.zeros(B, T, K, dtype=torch.float64)
    for b, (ids, logp) in enumerate(draws):
        for t, a in enumerate(ids):
            mu[b, t] = logp[t, a]
            order = logp[t].argsort(descending=True)[:K].tolist()
            if a not in order:
                order[-1] = a
            top_ids[b, t] = torch.tensor(order)
            top_logp[b, t] = logp[t, order]
    return mu, top_ids, top_logp


LENGTHS = [5, 2, 7, 4]  # ragged


@pytest.mark.parametrize("engine", ["vllm", "vllm_completions", "sglang"])
def test_engine_outputs_become_padded_tensors(engine):
    draws = engine_draws(LENGTHS)
    if engine == "vllm":
        tokens = from_vllm(vllm_outputs(draws), topk=K, pad_id=11)
    elif engine == "vllm_completions":
        tokens = from_vllm([c for r in vllm_outputs(draws) for c in r.outputs], topk=K, pad_id=11)
    else:
        tokens = from_sglang([sglang_response(ids, logp) for ids, logp in draws], topk=K, pad_id=11)
    T = max(LENGTHS)
    mask = torch.arange(T)[None] < torch.tensor(LENGTHS)[:, None]
    assert torch.equal(tokens.response_mask, mask)
    for b, (ids, _) in enumerate(draws):
        assert tokens.token_ids[b].tolist() == ids + [11] * (T - len(ids))
    mu, top_ids, top_logp = expected(draws, T)
    torch.testing.assert_close(tokens.mu_logp.double(), mu, atol=1e-6, rtol=0)  # 0.0 on padding
    assert torch.equal(tokens.mu_topk_ids[mask], top_ids[mask])
    torch.testing.assert_close(tokens.mu_topk_logp[mask].double(), top_logp[mask], atol=1e-6, rtol=0)
    assert torch.equal(tokens.mu_topk_ids[~mask], torch.arange(K).expand(int((~mask).sum()), K))
    assert torch.isneginf(tokens.mu_topk_logp[~mask]).all()


def test_sampled_token_outside_the_top_k_replaces_the_kth():
    logp = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64))
    out = CompletionOutput(0, "", [3], None, [vllm_position(3, logp[0], k=2)])
    tokens = from_vllm([out], topk=2)
    assert tokens.mu_topk_ids.tolist() == [[[0, 3]]]
    torch.testing.assert_close(tokens.mu_topk_logp, torch.tensor([[[math.log(0.5), math.log(0.05)]]]))


def test_a_top_k_shorter_than_k_is_filled_at_minus_inf():
    # SGLang gave 2 candidates where 4 were asked: the set is filled with ids it does not hold
    response = {
        "meta_info": {
            "output_token_logprobs": [[-0.1, 5, None]],
            "output_top_logprobs": [[[-0.1, 5, None], [-2.5, 0, None]]],
        }
    }
    tokens = from_sglang(response, topk=4)
    assert tokens.mu_topk_ids.tolist() == [[[5, 0, 1, 2]]]
    assert tokens.mu_topk_logp[0, 0, :2].tolist() == pytest.approx([-0.1, -2.5])
    assert torch.isneginf(tokens.mu_topk_logp[0, 0, 2:]).all()


def test_no_topk_and_a_fixed_length():
    draws = engine_draws([3, 1])
    tokens = from_vllm(vllm_outputs(draws), length=6)
    assert tokens.token_ids.shape == (2, 6) and tokens.mu_topk_ids is None
    assert set(tokens.record_args()) == {"token_ids", "response_mask", "mu_logp"}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: from_vllm([CompletionOutput(0, "", [1, 2], None, None)]), "response 0 has logprobs=None"),
        (
            lambda d: from_vllm(
                [CompletionOutput(0, "", [1, 2], None, [{1: Logprob(-0.1, 1)}, {3: Logprob(-0.2, 1)}])]
            ),
            "response 0, position 1: the logprobs lack the sampled token 2",
        ),
        (lambda d: from_vllm([CompletionOutput(0, "", [1], None, [])]), "1 token_ids but logprobs for 0 positions"),
        (lambda d: from_vllm("text"), "outputs must be a list"),
        (lambda d: from_vllm([object()]), r"outputs\[0\] is a object"),
        (lambda d: from_vllm(vllm_outputs(d), length=2), "length must be an int ≥ the longest response"),
        (lambda d: from_vllm(vllm_outputs(d), topk=0), "topk must be an integer ≥ 1"),
        (lambda d: from_sglang({"text": "x", "meta_info": {}}), "no meta_info.output_token_logprobs"),
        (
            lambda d: from_sglang({"meta_info": {"output_token_logprobs": [[-0.1, 5, None]]}}, topk=2),
            "no meta_info.output_top_logprobs",
        ),
        (
            lambda d: from_sglang({"meta_info": {"output_token_logprobs": [[0.5, 5, None]]}}),
            "response 0, position 0: log-probability must be a number ≤ 0",
        ),
        (
            lambda d: from_sglang({"meta_info": {"output_token_logprobs": [[None, 5, None]]}}),
            "log-probability must be a number",
        ),
    ],
)
def test_bad_outputs_are_refused_naming_where(make, message):
    with pytest.raises(ValueError, match=message):
        make(engine_draws([3, 2]))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_engine_outputs_become_a_recorded_run(tmp_path, engine):
    draws = engine_draws(LENGTHS, seed=3)
    if engine == "vllm":
        tokens = from_vllm(vllm_outputs(draws), topk=K)
        sampling = vllm_sampling(
            type("SamplingParams", (), {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "min_p": 0.0})(), "raw_logprobs"
        )
    else:
        tokens = from_sglang([sglang_response(ids, logp) for ids, logp in draws], topk=K)
        sampling = sglang_sampling({"temperature": 0.7, "top_p": 0.9}, "processed")
    T = tokens.token_ids.shape[1]
    logits = torch.zeros(len(draws), T, V, dtype=torch.float64)  # (B, T, V) π = μ on the responses
    for b, (ids, logp) in enumerate(draws):
        logits[b, : len(ids)] = logp
    pi_logp = tokens.mu_logp - 0.01 * tokens.response_mask  # (B, T) a ratio of e^−0.01 on every token
    with trustlens.TokenRecorder(tmp_path / "run", sampling=sampling) as rec:
        rec.record(
            0, **tokens.record_args(), pi_logp=pi_logp, logits=logits, advantages=torch.tensor([1.0, -1.0, 0.5, 0.0])
        )
    run = trustlens.load_run(tmp_path / "run")
    rows = run.tokens.collect().sort(["sample", "pos"])
    assert len(rows) == sum(LENGTHS)
    mu, _, _ = expected(draws, T)
    mask = tokens.response_mask
    assert rows["token_id"].to_list() == tokens.token_ids[mask].tolist()
    assert rows["mu_logp"].to_list() == pytest.approx(mu[mask].tolist(), abs=1e-6)
    assert rows["ratio"].to_list() == pytest.approx([math.exp(-0.01)] * len(rows), rel=1e-5)
    assert rows.filter(pl.col("pos") == 0).height == len(LENGTHS)
    assert max(rows["topk_tv"].to_list()) < 1e-6  # μ's top-K read right: π's logits are μ's
    expected_sampling = {"temperature": 0.7, "top_p": None if engine == "vllm" else 0.9, "top_k": None, "min_p": None}
    assert {k: run.manifest["sampling"][k] for k in expected_sampling} == expected_sampling
    assert run.manifest["sampling"]["logprobs"] == ("raw" if engine == "vllm" else "processed")


def test_trainer_settings_map_to_sampling():
    from types import SimpleNamespace

    from trustlens.integrations.openrlhf.sampling import openrlhf_sampling
    from trustlens.integrations.trl.sampling import trl_sampling
    from trustlens.integrations.verl.sampling import verl_sampling
    from trustlens.run.manifest import normalise_sampling

    grpo = dict(temperature=0.6, top_p=1.0, top_k=0, min_p=None, generation_kwargs=None)
    colocate = SimpleNamespace(**grpo, use_vllm=True, vllm_mode="colocate")
    assert normalise_sampling(trl_sampling(colocate)) == {
        "temperature": 0.6,
        "top_p": None,
        "top_k": None,
        "min_p": None,
        "logprobs": "processed",
        "processors": [],
    }
    server = SimpleNamespace(**{**grpo, "generation_kwargs": {"top_p": 0.8}}, use_vllm=True, vllm_mode="server")
    assert trl_sampling(server)["top_p"] == 0.8 and trl_sampling(server)["logprobs"] is None
    assert trl_sampling(SimpleNamespace(**grpo, use_vllm=False))["logprobs"] == "processed"

    rollout = {"name": "vllm", "temperature": 0.7, "top_p": 0.9, "top_k": -1}  # verl reads it as a DictConfig
    assert normalise_sampling(verl_sampling(rollout)) == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": None,
        "min_p": None,
        "logprobs": "raw",  # no logprobs_mode key: vLLM V1's default
        "processors": [],
    }
    rollout["logprobs_mode"] = "processed_logprobs"  # verl 0.7–0.9's default
    assert verl_sampling(rollout)["logprobs"] == "processed"
    rollout["name"] = "sglang"
    assert verl_sampling(rollout)["logprobs"] == "tempered"  # SGLang's log softmax(logits / τ)

    kwargs = {"do_sample": True, "max_new_tokens": 64, "temperature": 0.8, "top_p": 0.95}
    assert normalise_sampling(openrlhf_sampling(kwargs)) == {
        "temperature": 0.8,
        "top_p": 0.95,
        "top_k": None,
        "min_p": None,
        "logprobs": "raw",
        "processors": [],
    }
