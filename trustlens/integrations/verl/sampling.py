"""run.json `sampling` (TokenRecorder's `sampling=`) of a verl run, from its
`actor_rollout_ref.rollout` config: temperature, top_p, top_k (−1: off) and `logprobs_mode`
(verl 0.7–0.9: "processed_logprobs" by default, handed to vLLM); a config without that key (older
verl) is taken as vLLM V1's default, raw. With SGLang as the rollout engine: tempered (raw when
this process sees `SGLANG_RETURN_ORIGINAL_LOGPROB` set). The kinds of log μ:
trustlens.integrations.engines.sampling."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from trustlens.core.argument_checks import check_type
from trustlens.integrations.engines.sampling import VLLM_LOGPROBS_MODES, active_processors, checked_sampling


def verl_sampling(rollout: Mapping[str, Any]) -> dict[str, Any]:
    """`sampling` of verl's `actor_rollout_ref.rollout` config (a DictConfig or a mapping)."""
    if not callable(getattr(rollout, "get", None)):
        check_type("rollout", rollout, Mapping, "verl's actor_rollout_ref.rollout config (a DictConfig or a mapping)")
    sampling = {key: rollout.get(key) for key in ("temperature", "top_p", "top_k")}
    processors = active_processors(rollout.get)
    if rollout.get("name") == "sglang":
        original = os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "").lower() in ("1", "true")
        return checked_sampling({**sampling, "logprobs": "raw" if original else "tempered", "processors": processors})
    mode = rollout.get("logprobs_mode", "raw_logprobs")
    return checked_sampling({**sampling, "logprobs": VLLM_LOGPROBS_MODES.get(mode), "processors": processors})


__all__ = ["verl_sampling"]
