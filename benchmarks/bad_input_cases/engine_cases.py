"""The engine adapters (trustlens.integrations.engines, the trainers' `sampling` modules): the run.json
`sampling` read from vLLM, SGLang, TRL, verl and OpenRLHF settings, and the EngineTokens of
vLLM / SGLang outputs; TokenRecorder's `sampling=` and `model_kind=`; `trustlens train
--engine` and `trustlens doctor` given what a careless user types."""

from __future__ import annotations

from types import SimpleNamespace

from bad_input_cases import NAN, Case, Fixtures, bad, ok
from bad_input_cases.cli_cases import run_cli
from trustlens import TokenRecorder
from trustlens.integrations import engines
from trustlens.integrations.openrlhf.sampling import openrlhf_sampling
from trustlens.integrations.trl.sampling import trl_sampling
from trustlens.integrations.verl.sampling import verl_sampling

A = "engines"
PARAMS = SimpleNamespace(temperature=0.7, top_p=0.9, top_k=-1, min_p=0.0)  # a vLLM SamplingParams
SGLANG = {"meta_info": {"output_token_logprobs": [[-0.5, 3, None], [-1.0, 5, None]]}}  # one /generate response


def _recorder(fx: Fixtures, **kwargs) -> str:
    recorder = TokenRecorder(fx.fresh(), **kwargs)
    recorder.close()
    return "opened"


def cases(fx: Fixtures) -> list[Case]:
    settings = {
        "vllm_sampling None": (lambda: engines.vllm_sampling(None), ("params",)),
        "vllm_sampling a dict": (lambda: engines.vllm_sampling({"temperature": 0.7}), ("params", "SamplingParams")),
        "vllm_sampling mode typo": (lambda: engines.vllm_sampling(PARAMS, "processed_logprob"), ("logprobs_mode",)),
        "vllm_sampling temperature -1": (
            lambda: engines.vllm_sampling(SimpleNamespace(temperature=-1.0, top_p=1.0)),
            ("temperature",),
        ),
        "sglang_sampling None": (lambda: engines.sglang_sampling(None), ("sampling_params",)),
        "sglang_sampling logprobs typo": (lambda: engines.sglang_sampling({}, "rawx"), ("logprobs", "rawx")),
        "sglang_sampling temperature text": (lambda: engines.sglang_sampling({"temperature": "hot"}), ("temperature",)),
        "sglang_sampling top_p 2": (lambda: engines.sglang_sampling({"top_p": 2.0}), ("top_p",)),
        "trl_sampling None": (lambda: trl_sampling(None), ("args",)),
        "trl_sampling temperature NaN": (
            lambda: trl_sampling(SimpleNamespace(temperature=NAN)),
            ("temperature",),
        ),
        "verl_sampling None": (lambda: verl_sampling(None), ("rollout",)),
        "verl_sampling a list": (lambda: verl_sampling([1]), ("rollout",)),
        "verl_sampling top_k -5": (lambda: verl_sampling({"top_k": -5}), ("top_k",)),
        "openrlhf_sampling None": (lambda: openrlhf_sampling(None), ("generate_kwargs",)),
        "openrlhf_sampling temperature -1": (
            lambda: openrlhf_sampling({"temperature": -1}),
            ("temperature",),
        ),
        "from_vllm None": (lambda: engines.from_vllm(None), ("outputs",)),
        "from_vllm a string": (lambda: engines.from_vllm("out"), ("outputs",)),
        "from_vllm no outputs": (lambda: engines.from_vllm([]), ("responses",)),
        "from_sglang None": (lambda: engines.from_sglang(None), ("responses",)),
        "from_sglang a number": (lambda: engines.from_sglang(3), ("responses",)),
        "from_sglang without logprobs": (lambda: engines.from_sglang({"text": "x"}), ("output_token_logprobs",)),
        "from_sglang topk 0": (lambda: engines.from_sglang(SGLANG, topk=0), ("topk",)),
        "from_sglang length shorter": (lambda: engines.from_sglang(SGLANG, length=1), ("length",)),
        "from_sglang pad_id -1": (lambda: engines.from_sglang(SGLANG, pad_id=-1), ("pad_id",)),
    }
    recorder = {
        "model_kind typo": (dict(model_kind="mooe"), ("model_kind",)),
        "model_kind None": (dict(model_kind=None), ("model_kind",)),
        "sampling a string": (dict(sampling="temperature=0.7"), ("sampling",)),
        "sampling unknown key": (dict(sampling={"temprature": 0.7}), ("temprature",)),
        "sampling temperature 0": (dict(sampling={"temperature": 0}), ("temperature",)),
        "sampling top_k 2.5": (dict(sampling={"top_k": 2.5}), ("top_k",)),
        "sampling min_p 1": (dict(sampling={"min_p": 1.0}), ("min_p",)),
        "sampling logprobs typo": (dict(sampling={"logprobs": "processed_logprob"}), ("logprobs",)),
    }
    cli = {
        "train --engine typo": (["train", "--engine", "raw_logprob"], ("engine", "raw_logprob")),
        "train --engine empty": (["train", "--engine", ""], ("engine",)),
        "train --engine upper case": (["train", "--engine", "CLEAN"], ("engine",)),
        "doctor a folder that is no run": (["doctor", str(fx.variants["foreign"])], ("foreign",)),
        "doctor an empty folder": (["doctor", str(fx.variants["empty"])], ("empty",)),
        "doctor --format typo": (["doctor", str(fx.good), "--format", "jsn"], ("--format",)),
    }
    out = [bad(A, label, call, *words) for label, (call, words) in settings.items()]
    out += [
        bad(A, f"TokenRecorder {label}", lambda kw=kw: _recorder(fx, **kw), *words)
        for label, (kw, words) in recorder.items()
    ]
    out += [bad(A, label, lambda argv=argv: run_cli(argv), *words) for label, (argv, words) in cli.items()]
    out += [
        ok(
            A,
            "vllm_sampling the params as given",
            lambda: engines.vllm_sampling(PARAMS, "raw_logprobs"),
            lambda r: r == {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "min_p": 0.0, "logprobs": "raw"},
        ),
        ok(
            A,
            "sglang_sampling defaults",
            lambda: engines.sglang_sampling({}),
            lambda r: r["temperature"] == 1.0 and r["top_k"] == -1 and r["logprobs"] is None,
        ),
        ok(
            A,
            "verl_sampling sglang engine",
            lambda: verl_sampling({"name": "sglang", "temperature": 1.0}),
            lambda r: r["logprobs"] is None,
        ),
        ok(
            A,
            "from_sglang one response",
            lambda: engines.from_sglang(SGLANG),
            lambda r: r.record_args()["mu_logp"].tolist() == [[-0.5, -1.0]],
        ),
        ok(A, "TokenRecorder sampling None", lambda: _recorder(fx, sampling=None), lambda r: r == "opened"),
        ok(A, "TokenRecorder model_kind moe", lambda: _recorder(fx, model_kind="moe"), lambda r: r == "opened"),
        ok(
            A,
            "TokenRecorder sampling all off",
            lambda: _recorder(fx, sampling={"top_p": 1.0, "top_k": -1, "min_p": 0.0}),
            lambda r: r == "opened",
        ),
    ]
    return out
