"""Bad inputs to the engine adapters (issue 32): the run.json `sampling` read from the settings
of vLLM, SGLang, TRL, verl and OpenRLHF, and the EngineTokens of SGLang responses. Each case
asserts the error type and that the message names the argument or the setting."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from trustlens.integrations import engines
from trustlens.integrations.openrlhf.sampling import openrlhf_sampling
from trustlens.integrations.trl.sampling import trl_sampling
from trustlens.integrations.verl.sampling import verl_sampling

SGLANG = {"meta_info": {"output_token_logprobs": [[-0.5, 3, None], [-1.0, 5, None]]}}

CASES = [
    (lambda: engines.vllm_sampling(None), TypeError, "^params must be a vLLM SamplingParams"),
    (lambda: engines.vllm_sampling({"temperature": 0.7}), TypeError, "^params must be a vLLM SamplingParams"),
    (lambda: engines.vllm_sampling(SimpleNamespace(temperature=-1.0, top_p=1.0)), ValueError, "temperature"),
    (lambda: engines.sglang_sampling(None), TypeError, "^sampling_params must be"),
    (lambda: engines.sglang_sampling({}, "rawx"), ValueError, "logprobs.*'rawx'"),
    (lambda: engines.sglang_sampling({"temperature": "hot"}), ValueError, "temperature"),
    (lambda: engines.sglang_sampling({"top_p": 2.0}), ValueError, "top_p"),
    (lambda: trl_sampling(None), TypeError, "^args must be a TRL GRPOConfig"),
    (lambda: trl_sampling(SimpleNamespace(temperature=math.nan)), ValueError, "temperature"),
    (lambda: verl_sampling(None), TypeError, "^rollout must be"),
    (lambda: verl_sampling([1]), TypeError, "^rollout must be"),
    (lambda: verl_sampling({"top_k": -5}), ValueError, "top_k"),
    (lambda: openrlhf_sampling(None), TypeError, "^generate_kwargs must be"),
    (lambda: openrlhf_sampling({"temperature": -1}), ValueError, "temperature"),
    (lambda: engines.from_sglang(None), TypeError, "^responses must be"),
    (lambda: engines.from_sglang(3), TypeError, "^responses must be"),
    (lambda: engines.from_sglang(SGLANG, topk=0), ValueError, "^topk must be an integer ≥ 1"),
    (lambda: engines.from_sglang(SGLANG, topk=2.0), TypeError, "^topk must be an integer"),
    (lambda: engines.from_vllm([], topk=-1), ValueError, "^topk must be an integer ≥ 1"),
]


@pytest.mark.parametrize(("call", "error", "named"), CASES)
def test_engine_settings_name_the_argument(call, error, named):
    with pytest.raises(error, match=named):
        call()


def test_valid_engine_settings_are_returned_as_given():
    params = SimpleNamespace(temperature=0.7, top_p=0.9, top_k=-1, min_p=0.0)
    got = engines.vllm_sampling(params, "raw_logprobs")
    assert got == {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "min_p": 0.0, "logprobs": "raw", "processors": []}
    assert engines.sglang_sampling({}) == {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "logprobs": "tempered",  # SGLang's log softmax(logits / τ)
        "processors": [],
    }
    assert verl_sampling({"name": "sglang", "temperature": 1.0})["logprobs"] == "tempered"
    assert engines.from_sglang(SGLANG).record_args()["mu_logp"].tolist() == [[-0.5, -1.0]]
