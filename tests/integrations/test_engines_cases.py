"""trustlens.integrations.engines on outputs built the way the engines' own code builds them. vLLM
and SGLang are not importable here (CUDA builds): these are faithful fixtures, plain dataclasses
with the engines' field names and SGLang's JSON as an HTTP client decodes it, each citing the
engine file and function it follows."""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from trustlens.integrations.engines import from_sglang, from_vllm, sglang_sampling, vllm_sampling
from trustlens.integrations.engines.sampling import _PROCESSOR_KEYS
from trustlens.integrations.trl.sampling import trl_sampling
from trustlens.integrations.verl.sampling import verl_sampling
from trustlens.run.manifest import PROCESSORS, normalise_sampling

V = 10


@dataclass
class Logprob:  # vllm/logprobs.py: Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class SamplingMask:  # vllm/outputs.py (return_sampling_mask): per generated token the ids of its support
    token_ids: list[list[int]]


@dataclass
class CompletionOutput:  # vllm/outputs.py: CompletionOutput, with sampling_mask and weight_versions
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = "stop"
    sampling_mask: SamplingMask | None = None
    weight_versions: list | None = None


@dataclass
class SamplingParams:  # vllm/sampling_params.py: SamplingParams, the fields read here, vLLM's defaults
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict | None = None
    bad_words: list | None = None
    allowed_token_ids: list | None = None
    min_tokens: int = 0
    logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    structured_outputs: object = None
    extra: dict = field(default_factory=dict)


def logits_and_draw(n: int, seed: int = 0):
    """(n, V) float64 logits and the ids sampled from softmax(logits)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, V, generator=gen, dtype=torch.float64) * 3
    ids = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)[:, 0]
    return logits, ids.tolist()


def vllm_ranked(values: torch.Tensor, token: int, chosen: list[int]) -> dict[int, Logprob]:
    """One position as vllm/v1/engine/logprobs.py (LogprobsProcessor._update_sample_logprobs) builds
    it: the sampled id with its rank among all ids, then the `chosen` ids ranked 1, 2, … in order."""
    order = values.argsort(descending=True).tolist()
    entry = {token: Logprob(float(values[token]), order.index(token) + 1)}
    for r, i in enumerate(chosen):
        entry.setdefault(i, Logprob(float(values[i]), r + 1))
    return entry


# 1. vLLM SamplingParams(logprob_token_ids=[…]): the chosen ids ranked by list position
def test_vllm_logprob_token_ids_are_not_taken_as_the_top_k():
    logits, ids = logits_and_draw(4)
    logp = torch.log_softmax(logits, -1)
    chosen = [7, 2, 9]
    params = SamplingParams(temperature=1.0, logprob_token_ids=chosen)
    positions = [vllm_ranked(logp[t], a, chosen) for t, a in enumerate(ids)]
    out = [CompletionOutput(0, "", ids, None, positions)]
    with pytest.raises(ValueError, match=r"logprob_token_ids=…\): their dicts hold the chosen ids"):
        from_vllm(out, topk=3, params=params)
    with pytest.raises(ValueError, match="ranked after a less likely id, so these logprobs are not μ's top-K"):
        from_vllm(out, topk=3)  # without params: the ranks contradict the log-probs
    tokens = from_vllm(out, params=params)  # log μ of the sampled ids alone
    expected = [float(logp[t, a]) for t, a in enumerate(ids)]
    assert tokens.mu_logp[0].tolist() == pytest.approx(expected, abs=1e-6)


# 2. vLLM logprobs_mode="raw_logits" / "processed_logits": logits, not log-probs
@pytest.mark.parametrize("mode", ["raw_logits", "processed_logits"])
def test_vllm_logits_modes_are_refused(mode):
    logits, ids = logits_and_draw(3, seed=1)
    # vllm/v1/sample/sampler.py (Sampler.forward, logprobs_mode "…_logits"): the logits themselves
    positions = [vllm_ranked(logits[t], a, logits[t].argsort(descending=True)[:3].tolist()) for t, a in enumerate(ids)]
    out = [CompletionOutput(0, "", ids, None, positions)]
    with pytest.raises(ValueError, match=f"logprobs_mode {mode!r} returns logits"):
        from_vllm(out, logprobs_mode=mode)
    with pytest.raises(ValueError, match=f"logprobs_mode {mode!r} returns logits"):
        vllm_sampling(SamplingParams(), mode)
    with pytest.raises(ValueError, match="logprobs_mode 'raw_logits' / 'processed_logits' returns logits"):
        from_vllm(out)  # not told: the values (some > 0, or more than probability 1 in all) give it away
    negative = [{i: Logprob(lp.logprob - 1.0, lp.rank) for i, lp in p.items()} for p in positions]
    shifted = float(max(lp.logprob for p in negative for lp in p.values()))
    if shifted <= 0:  # all-negative logits: their probabilities add up to more than 1
        with pytest.raises(ValueError, match="add up to probability"):
            from_vllm([CompletionOutput(0, "", ids, None, negative)])


# 3. vLLM temperature 0: greedy (vllm/sampling_params.py: temperature < _SAMPLING_EPS)
def test_vllm_greedy_is_recorded_as_top_k_1():
    greedy = SamplingParams(temperature=0.0, logprobs=5)
    assert normalise_sampling(vllm_sampling(greedy, "processed_logprobs")) == {
        "temperature": 1.0,
        "top_p": None,
        "top_k": 1,
        "min_p": None,
        # Sampler.sample returns log_softmax(logits) for an all-greedy batch: before truncation
        "logprobs": "tempered",
        "processors": [],
    }
    assert vllm_sampling(greedy, "raw_logprobs")["logprobs"] == "raw"


# 4 and 5. SGLang temperature 0 and JSON nulls (sglang/srt/sampling/sampling_params.py: SamplingParams.__init__)
def test_sglang_greedy_and_nulls_take_sglangs_own_settings():
    greedy = sglang_sampling({"temperature": 0, "top_p": None, "top_k": None, "min_p": None, "max_new_tokens": 8})
    assert normalise_sampling(greedy) == {
        "temperature": 1.0,
        "top_p": None,
        "top_k": 1,
        "min_p": None,
        "logprobs": "tempered",
        "processors": [],
    }
    nulls = sglang_sampling({"temperature": None, "top_p": None, "top_k": None, "min_p": None})
    assert (nulls["temperature"], nulls["top_p"], nulls["top_k"], nulls["min_p"]) == (1.0, 1.0, -1, 0.0)
    assert normalise_sampling(sglang_sampling({"temperature": 0.7, "top_k": 1 << 30}))["top_k"] is None


def sglang_meta(ids: list[int], logp: torch.Tensor, k: int) -> dict:
    """meta_info of /generate (return_logprob, top_logprobs_num=k) as tokenizer_manager.py
    (TokenizerManager.convert_logprob_style / detokenize_top_logprobs_tokens) builds it."""
    top = []
    for t in range(len(ids)):
        order = logp[t].argsort(descending=True)[:k].tolist()
        top.append([[float(logp[t, i]), i, None] for i in order])
    tokens = [[float(logp[t, a]), a, None] for t, a in enumerate(ids)]
    return {"output_token_logprobs": tokens, "output_top_logprobs": top, "weight_version": "default"}


def flat(meta: dict, *, b64: bool, rows_with_prefix: bool, prefix: int = 0) -> dict:
    """meta with output_top_logprobs as return_flat_raw_output_top_logprobs gives it
    (tokenizer_manager.py: the flat builder; little-endian float32 values and int32 ids)."""
    nested = meta.pop("output_top_logprobs")[prefix:]
    k = len(nested[0])
    val = np.asarray([[e[0] for e in row] for row in nested], dtype="<f4")
    idx = np.asarray([[e[1] for e in row] for row in nested], dtype="<i4")
    rows = len(nested) + (prefix if rows_with_prefix else 0)
    out = {"output_top_logprobs_shape": [rows, k], "output_top_logprobs_null_prefix": prefix}
    if b64:
        out |= {
            "output_top_logprobs_val_flat_b64": base64.b64encode(val.tobytes()).decode("ascii"),
            "output_top_logprobs_idx_flat_b64": base64.b64encode(idx.tobytes()).decode("ascii"),
            "output_top_logprobs_val_flat_b64_dtype": "float32",
            "output_top_logprobs_idx_flat_b64_dtype": "int32",
        }
    else:
        out |= {
            "output_top_logprobs_val_flat": val.ravel().tolist(),
            "output_top_logprobs_idx_flat": idx.ravel().tolist(),
        }
    return meta | out


# 6. SGLang return_flat_raw_output_top_logprobs, plain and base64
@pytest.mark.parametrize("b64", [False, True])
@pytest.mark.parametrize("rows_with_prefix", [False, True])
def test_sglang_flat_top_logprobs_read_as_the_nested_ones(b64, rows_with_prefix):
    logits, ids = logits_and_draw(5, seed=2)
    logp = torch.log_softmax(logits, -1).float().double()  # float32 on the wire
    nested = from_sglang({"meta_info": sglang_meta(ids, logp, 3)}, topk=3)
    flat_one = from_sglang({"meta_info": flat(sglang_meta(ids, logp, 3), b64=b64, rows_with_prefix=False)}, topk=3)
    assert torch.equal(flat_one.mu_topk_ids, nested.mu_topk_ids)
    torch.testing.assert_close(flat_one.mu_topk_logp, nested.mu_topk_logp)
    prefixed = flat(sglang_meta(ids, logp, 3), b64=b64, rows_with_prefix=rows_with_prefix, prefix=2)
    tokens = from_sglang({"meta_info": prefixed}, topk=3)
    assert torch.equal(tokens.mu_topk_ids[0, 2:], nested.mu_topk_ids[0, 2:])
    # no candidates at the null prefix: the sampled id alone, the rest at −inf
    assert tokens.mu_topk_ids[0, :2, 0].tolist() == ids[:2]
    assert torch.isneginf(tokens.mu_topk_logp[0, :2, 1:]).all()


def test_sglang_flat_top_logprobs_that_do_not_fit_are_refused():
    logits, ids = logits_and_draw(4, seed=2)
    meta = flat(sglang_meta(ids, torch.log_softmax(logits, -1), 3), b64=False, rows_with_prefix=False)
    meta["output_top_logprobs_shape"] = [6, 3]
    with pytest.raises(ValueError, match=r"shape \[6, 3\] with null prefix 0 do not cover the 4 output tokens"):
        from_sglang({"meta_info": meta}, topk=3)
    meta = flat(sglang_meta(ids, torch.log_softmax(logits, -1), 3), b64=True, rows_with_prefix=False)
    meta["output_top_logprobs_val_flat_b64"] = "not base64!"
    with pytest.raises(ValueError, match="output_top_logprobs_val_flat_b64 is not base64"):
        from_sglang({"meta_info": meta}, topk=3)


# 7. SGLang's three kinds of log μ; sampling masks and the processed μ (return_sampling_mask)
def test_sglang_kinds_of_mu_and_its_sampling_mask():
    logits, ids = logits_and_draw(4, seed=3)
    tau, top_p = 0.7, 0.8
    tempered = torch.log_softmax(logits / tau, -1)  # sglang/srt/layers/sampler.py: log(softmax(logits / τ))
    supports, processed = [], []
    for t, a in enumerate(ids):  # the top-p support of the tempered distribution, with the sampled id
        order = tempered[t].argsort(descending=True).tolist()
        cum = tempered[t, order].exp().cumsum(0)
        keep = order[: int((cum < top_p).sum()) + 1]
        keep = keep if a in keep else [*keep, a]
        supports.append(keep)
        processed.append(float(tempered[t, a] - torch.logsumexp(tempered[t, keep], 0)))
    meta = sglang_meta(ids, tempered, 2) | {
        "output_token_sampling_mask": supports,
        "output_token_sampling_logprobs": processed,  # sampling_logprobs_mode "selected"
        "weight_versions": [{"version": "4", "start": 0, "end": 2}, {"version": "5", "start": 2, "end": 4}],
    }
    default = from_sglang({"meta_info": meta})
    assert default.mu_logp[0].tolist() == pytest.approx([float(tempered[t, a]) for t, a in enumerate(ids)], abs=1e-6)
    exact = from_sglang({"meta_info": meta}, processed=True)
    assert exact.mu_logp[0].tolist() == pytest.approx(processed, abs=1e-6)
    assert exact.support_size[0].tolist() == [len(s) for s in supports]
    assert exact.weight_version[0].tolist() == [4, 4, 5, 5]
    assert exact.staleness(6)[0].tolist() == [2, 2, 1, 1]
    support_mode = meta | {
        "output_token_sampling_logprobs": [
            [float(tempered[t, i] - torch.logsumexp(tempered[t, s], 0)) for i in s] for t, s in enumerate(supports)
        ]
    }
    assert from_sglang({"meta_info": support_mode}, processed=True).mu_logp[0].tolist() == pytest.approx(
        processed, abs=1e-6
    )
    assert sglang_sampling({"temperature": tau, "top_p": top_p})["logprobs"] == "tempered"
    assert sglang_sampling({"temperature": tau}, "raw")["logprobs"] == "raw"  # SGLANG_RETURN_ORIGINAL_LOGPROB=1
    with pytest.raises(ValueError, match="output_token_sampling_logprobs has none entries"):
        from_sglang({"meta_info": sglang_meta(ids, tempered, 2)}, processed=True)
    bad = meta | {"output_token_sampling_mask": [[ids[0] + 1 if ids[0] + 1 < V else 0], *supports[1:]]}
    with pytest.raises(ValueError, match="position 0: the sampling mask lacks the sampled token"):
        from_sglang({"meta_info": bad})


def test_vllm_sampling_mask_and_weight_versions():
    logits, ids = logits_and_draw(3, seed=4)
    logp = torch.log_softmax(logits, -1)
    supports = [sorted({a, int(logp[t].argmax())}) for t, a in enumerate(ids)]
    positions = [vllm_ranked(logp[t], a, logp[t].argsort(descending=True)[:2].tolist()) for t, a in enumerate(ids)]
    out = CompletionOutput(0, "", ids, None, positions, sampling_mask=SamplingMask(supports), weight_versions=[3, 3, 4])
    tokens = from_vllm([out, CompletionOutput(1, "", ids[:1], None, positions[:1])], topk=2)
    assert tokens.support_size.tolist() == [[len(s) for s in supports], [0, 0, 0]]  # 0: no mask
    assert tokens.weight_version.tolist() == [[3, 3, 4], [-1, -1, -1]]
    with pytest.raises(ValueError, match="response 1, position 0: its weight version is not known"):
        tokens.staleness(4)
    assert from_vllm([out]).staleness(4).tolist() == [[1, 1, 0]]
    with pytest.raises(ValueError, match="trainer_version 3 is older than a token's weight version"):
        from_vllm([out]).staleness(3)


def test_processors_are_named_in_sampling():
    assert tuple(_PROCESSOR_KEYS) == PROCESSORS
    params = SamplingParams(temperature=0.8, repetition_penalty=1.1, logit_bias={5: 2.0}, bad_words=[], min_tokens=2)
    assert vllm_sampling(params, "processed_logprobs")["processors"] == [
        "repetition_penalty",
        "logit_bias",
        "min_tokens",
    ]
    request = {"temperature": 0.8, "frequency_penalty": 0.5, "regex": "[a-z]+", "min_new_tokens": 0}
    assert normalise_sampling(sglang_sampling(request))["processors"] == ["frequency_penalty", "grammar"]
    grpo = SimpleNamespace(temperature=1.0, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.2, use_vllm=False)
    assert trl_sampling(grpo)["processors"] == ["repetition_penalty"]
    assert verl_sampling({"name": "sglang", "temperature": 1.0})["logprobs"] == "tempered"


def test_a_response_without_versions_in_a_batch_with_them_is_unknown():
    logits, ids = logits_and_draw(2, seed=5)
    logp = torch.log_softmax(logits, -1)
    meta = sglang_meta(ids, logp, 2)
    tokens = from_sglang([{"meta_info": meta | {"weight_version": "7"}}, {"meta_info": meta}])
    assert tokens.weight_version.tolist() == [[7, 7], [-1, -1]]  # "default" (before any update): not known
    with pytest.raises(ValueError, match="weight version span"):
        from_sglang({"meta_info": meta | {"weight_versions": [{"version": "1", "start": 0, "end": 5}]}})
    assert math.isfinite(float(tokens.mu_logp.sum()))


def test_support_mass_and_staleness_are_recorded(tmp_path):
    import trustlens

    logits, ids = logits_and_draw(4, seed=6)
    tau, top_p = 0.7, 0.8
    tempered = torch.log_softmax(logits / tau, -1)  # π = μ: the engine samples from the trainer's π
    supports, processed = [], []
    for t, a in enumerate(ids):
        order = tempered[t].argsort(descending=True).tolist()
        keep = order[: int((tempered[t, order].exp().cumsum(0) < top_p).sum()) + 1]
        keep = keep if a in keep else [*keep, a]
        supports.append(keep)
        processed.append(float(tempered[t, a] - torch.logsumexp(tempered[t, keep], 0)))
    meta = sglang_meta(ids, tempered, 2) | {
        "output_token_sampling_mask": supports,
        "output_token_sampling_logprobs": processed,
        "weight_versions": [{"version": "4", "start": 0, "end": 4}],
    }
    tokens = from_sglang({"meta_info": meta}, processed=True)
    pi_logits = logits[None]  # (1, T, V) π's logits before the temperature
    mass = tokens.pi_support_mass(pi_logits, tau)[0]
    expected = [float(tempered[t, s].exp().sum()) for t, s in enumerate(supports)]
    assert mass.tolist() == pytest.approx(expected, abs=1e-6)
    pi_logp = torch.log_softmax(logits / tau, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0][None].float()
    with trustlens.TokenRecorder(tmp_path / "run") as rec:
        args = tokens.record_args(logits=pi_logits, temperature=tau, trainer_version=5)
        rec.record(0, **args, pi_logp=pi_logp, advantages=torch.tensor([1.0]))
    rows = trustlens.load_run(tmp_path / "run").tokens.collect().sort("pos")
    assert rows["support_size"].to_list() == [float(len(s)) for s in supports]
    assert rows["pi_support_mass"].to_list() == pytest.approx(expected, abs=1e-6)
    assert rows["staleness"].to_list() == [1.0] * 4
    # the exact truncation: log μ − (log π − log Σ_S π) = 0 with μ the processed μ of π itself
    exact = rows["mu_logp"] - (rows["pi_logp"] - rows["pi_support_mass"].log())
    assert exact.abs().max() < 1e-5


@dataclass
class VersionedRequestOutput:  # vllm/outputs.py RequestOutput with the version bound at admission (vLLM #53199)
    request_id: str
    outputs: list
    weight_version: str | None = None


def test_vllm_request_bound_weight_version_labels():
    logits, ids = logits_and_draw(2, seed=7)
    logp = torch.log_softmax(logits, -1)
    positions = [vllm_ranked(logp[t], a, []) for t, a in enumerate(ids)]
    completions = [CompletionOutput(i, "", ids, None, positions) for i in range(3)]
    requests = [
        VersionedRequestOutput("a", completions[:1], "step-42"),  # vLLM's versions are labels
        VersionedRequestOutput("b", completions[1:2], "default"),  # before the first weight update
        VersionedRequestOutput("c", completions[2:], "17"),
    ]
    assert from_vllm(requests).weight_version.tolist() == [[42, 42], [-1, -1], [17, 17]]
