"""run.json `sampling` (TokenRecorder's `sampling=`) from the settings of the trainers that the
hooks attach to: what temperature and filters their rollout engine samples with, and whether the
log μ it returns is raw (before the temperature and the filters) or processed. No trainer is
imported: each function reads attributes or keys of the config object it is given.

- TRL (`trl_sampling`): GRPOConfig's temperature, top_p, top_k, min_p (a `generation_kwargs`
  entry overrides them, as in TRL). With vLLM in colocate mode TRL builds the engine with
  `logprobs_mode="processed_logprobs"`: processed; in server mode the server's
  `--logprobs-mode` decides, which the trainer does not know: None. Without vLLM: processed (TRL's
  own generation; it returns no μ, so the run's mu_logp is null anyway).
- verl (`verl_sampling`): `actor_rollout_ref.rollout`'s temperature, top_p, top_k (−1: off) and
  `logprobs_mode` (verl 0.7–0.9: "processed_logprobs" by default, handed to vLLM); a config
  without that key (older verl) is taken as vLLM V1's default, raw. With SGLang as the rollout
  engine `logprobs_mode` does not apply: None.
- OpenRLHF (`openrlhf_sampling`): the trainer's `generate_kwargs` (temperature, top_p; 0.11 sets
  no top_k or min_p) and no `logprobs_mode` given to vLLM, so vLLM V1's default: raw.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trustlens.core.values import check_attributes, check_type
from trustlens.integrations.engines import VLLM_LOGPROBS_MODES, checked_sampling

_FILTERS = ("temperature", "top_p", "top_k", "min_p")


def trl_sampling(args: Any) -> dict[str, Any]:
    """`sampling` of a TRL GRPOConfig (module docstring)."""
    check_attributes("args", args, ("temperature",), "a TRL GRPOConfig")
    overrides = getattr(args, "generation_kwargs", None) or {}
    sampling = {key: overrides.get(key, getattr(args, key, None)) for key in _FILTERS}
    if not getattr(args, "use_vllm", False):
        logprobs: str | None = "processed"
    else:
        logprobs = "processed" if getattr(args, "vllm_mode", "server") == "colocate" else None
    return checked_sampling({**sampling, "logprobs": logprobs})


def verl_sampling(rollout: Mapping[str, Any]) -> dict[str, Any]:
    """`sampling` of verl's `actor_rollout_ref.rollout` config (a DictConfig or a mapping)."""
    if not callable(getattr(rollout, "get", None)):
        check_type("rollout", rollout, Mapping, "verl's actor_rollout_ref.rollout config (a DictConfig or a mapping)")
    sampling = {key: rollout.get(key) for key in ("temperature", "top_p", "top_k")}
    if rollout.get("name") == "sglang":
        return checked_sampling({**sampling, "logprobs": None})
    mode = rollout.get("logprobs_mode", "raw_logprobs")
    return checked_sampling({**sampling, "logprobs": VLLM_LOGPROBS_MODES.get(mode)})


def openrlhf_sampling(generate_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """`sampling` of an OpenRLHF trainer's `generate_kwargs` (module docstring)."""
    check_type("generate_kwargs", generate_kwargs, Mapping, "the trainer's generate_kwargs mapping")
    return checked_sampling({**{key: generate_kwargs.get(key) for key in _FILTERS}, "logprobs": "raw"})


__all__ = ["openrlhf_sampling", "trl_sampling", "verl_sampling"]
