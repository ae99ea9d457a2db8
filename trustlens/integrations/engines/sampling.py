"""run.json `sampling` (TokenRecorder's `sampling=`) from the rollout engines' settings: what
temperature, filters and logit processors the engine samples with, and which of the three kinds
of log μ it returns. No engine is imported: each function reads attributes or keys of the object
it is given. The trainers' own (`trl_sampling`, `verl_sampling`, `openrlhf_sampling`: the
`sampling` module of each trainer's package) read their configs with the helpers here.

The three kinds of log μ (run.json sampling["logprobs"]; z: the logits, after the processors
the kind names, τ: the temperature):

    raw        log softmax(z)            before the temperature
    tempered   log softmax(z / τ)        after the temperature, before top-p / top-k / min-p
    processed  log of the distribution the token was drawn from: after every processor,
               renormalised over the truncated support

- vLLM (`vllm_sampling`): `logprobs_mode` "raw_logprobs" (V1's default: raw, before every
  processor) or "processed_logprobs" (processed). The "…_logits" modes return logits, not
  log-probabilities, and are refused. Greedy (temperature < 1e-5) samples the argmax: top_k 1
  at τ 1, and vLLM's processed log-probs of a greedy request are taken before truncation:
  tempered.
- SGLang (`sglang_sampling`): log softmax(z/τ) over the logits after its penalties, bias and
  grammar mask: tempered; raw with `SGLANG_RETURN_ORIGINAL_LOGPROB=1`; processed where μ is
  read from `output_token_sampling_logprobs` (`return_sampling_mask`, `from_sglang(processed=True)`).
  A JSON null takes SGLang's default; temperature 0 is greedy (SGLang: τ 1, top_k 1).

`processors` lists the active logit processors that change μ besides the temperature and the
filters (PROCESSORS); [] when none is set.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from trustlens.core.argument_checks import check_attributes, check_type
from trustlens.run.manifest import normalise_sampling

# vLLM's `logprobs_mode` values that return log-probabilities -> run.json sampling["logprobs"]
VLLM_LOGPROBS_MODES = {"raw_logprobs": "raw", "processed_logprobs": "processed"}
VLLM_LOGITS_MODES = ("raw_logits", "processed_logits")  # return logits: refused
GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS: a temperature below it samples greedily
FILTERS = ("temperature", "top_p", "top_k", "min_p")  # the sampling filters, as run.json names them
# processor -> (the settings' keys that turn it on, the value that leaves it off)
_PROCESSOR_KEYS: dict[str, tuple[tuple[str, ...], Any]] = {
    "repetition_penalty": (("repetition_penalty",), 1.0),
    "presence_penalty": (("presence_penalty",), 0.0),
    "frequency_penalty": (("frequency_penalty",), 0.0),
    "logit_bias": (("logit_bias",), None),
    "bad_words": (("bad_words",), None),
    "allowed_token_ids": (("allowed_token_ids",), None),
    "min_tokens": (("min_tokens", "min_new_tokens"), 0),
    "grammar": (("structured_outputs", "guided_decoding", "regex", "json_schema", "ebnf", "structural_tag"), None),
    "custom": (("custom_logit_processor", "logits_processors"), None),
}


def active_processors(get: Callable[[str], Any]) -> list[str]:
    """The processors of PROCESSORS whose setting (read with `get(key)`, None when absent) is on:
    a penalty ≠ its neutral value, a non-empty bias, word list, id list or grammar."""
    active = []
    for name, (keys, off) in _PROCESSOR_KEYS.items():
        for key in keys:
            value = get(key)
            if value is None or value is False or (hasattr(value, "__len__") and len(value) == 0):
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool) and float(value) == float(off or 0.0):
                continue
            active.append(name)
            break
    return active


def check_vllm_logprobs_mode(logprobs_mode: str | None) -> None:
    """Refuse a vLLM `logprobs_mode` that is not one of VLLM_LOGPROBS_MODES or None: a "…_logits"
    mode returns logits, which lack the normaliser over the vocabulary that log μ needs."""
    if logprobs_mode in VLLM_LOGITS_MODES:
        raise ValueError(
            f"logprobs_mode {logprobs_mode!r} returns logits, not log-probabilities (log μ needs the normaliser "
            "over the whole vocabulary): serve vLLM with logprobs_mode='processed_logprobs' (or 'raw_logprobs')"
        )
    if logprobs_mode is not None and logprobs_mode not in VLLM_LOGPROBS_MODES:
        raise ValueError(
            f"logprobs_mode must be one of {', '.join(VLLM_LOGPROBS_MODES)} or None, got {logprobs_mode!r}"
        )


def vllm_sampling(params: Any, logprobs_mode: str | None = None) -> dict[str, Any]:
    """TokenRecorder's `sampling` from a vLLM SamplingParams (or anything with its temperature,
    top_p, top_k, min_p and processor settings) and the engine's `logprobs_mode` (vLLM V1's
    default "raw_logprobs"; None: not known). Greedy (temperature < 1e-5): τ 1, top_k 1."""
    check_vllm_logprobs_mode(logprobs_mode)
    check_attributes("params", params, ("temperature", "top_p"), "a vLLM SamplingParams")
    sampling = {key: getattr(params, key, None) for key in FILTERS}
    kind = None if logprobs_mode is None else VLLM_LOGPROBS_MODES[logprobs_mode]
    tau = sampling["temperature"]
    if isinstance(tau, (int, float)) and not isinstance(tau, bool) and 0 <= tau < GREEDY_BELOW:
        # vLLM takes the argmax; its processed log-probs of a greedy row skip the temperature and
        # the filters (vllm/v1/sample/sampler.py, Sampler.sample's all-greedy path)
        sampling = {"temperature": 1.0, "top_p": None, "top_k": 1, "min_p": None}
        kind = "tempered" if kind == "processed" else kind
    processors = active_processors(lambda key: getattr(params, key, None))
    return checked_sampling({**sampling, "logprobs": kind, "processors": processors})


# SGLang's defaults where a key of sampling_params is absent or null (sglang/srt/sampling/sampling_params.py)
SGLANG_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0}
SGLANG_TOP_K_ALL = 1 << 30  # SGLang's "no top-k" as its sampling_params may carry it


def sglang_sampling(sampling_params: Mapping[str, Any], logprobs: str | None = "tempered") -> dict[str, Any]:
    """TokenRecorder's `sampling` from the `sampling_params` of a /generate request: SGLang's
    defaults where a key is absent or null (temperature 1, top_p 1, top_k −1, min_p 0);
    temperature 0 is greedy (τ 1, top_k 1, as SGLang sets it). `logprobs`: the kind of log μ
    read (module docstring): "tempered" (the server's default), "raw" (the server runs with
    SGLANG_RETURN_ORIGINAL_LOGPROB=1), "processed" (`from_sglang(processed=True)`), None."""
    check_type("sampling_params", sampling_params, Mapping, "the sampling_params mapping of a /generate request")
    sampling = {
        key: sampling_params[key] if sampling_params.get(key) is not None else value
        for key, value in SGLANG_DEFAULTS.items()
    }
    if sampling["top_k"] == SGLANG_TOP_K_ALL:
        sampling["top_k"] = -1
    tau = sampling["temperature"]
    if isinstance(tau, (int, float)) and not isinstance(tau, bool) and 0 <= tau < GREEDY_BELOW:
        sampling["temperature"], sampling["top_k"] = 1.0, 1
    processors = active_processors(sampling_params.get)
    return checked_sampling({**sampling, "logprobs": logprobs, "processors": processors})


def checked_sampling(sampling: dict[str, Any]) -> dict[str, Any]:
    """`sampling` as given, once `normalise_sampling` (what TokenRecorder's `sampling=` checks)
    accepts it: a bad setting is refused where it is read from the engine's configuration,
    naming the key, not later when the recorder opens the run."""
    normalise_sampling(sampling)
    return sampling


__all__ = [
    "FILTERS",
    "GREEDY_BELOW",
    "SGLANG_DEFAULTS",
    "VLLM_LOGITS_MODES",
    "VLLM_LOGPROBS_MODES",
    "active_processors",
    "check_vllm_logprobs_mode",
    "checked_sampling",
    "sglang_sampling",
    "vllm_sampling",
]
