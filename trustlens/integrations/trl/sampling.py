"""run.json `sampling` (TokenRecorder's `sampling=`) of a TRL run, from its GRPOConfig: the
temperature, top_p, top_k, min_p and repetition_penalty (a `generation_kwargs` entry overrides
them, as in TRL). With vLLM in colocate mode TRL builds the engine with
`logprobs_mode="processed_logprobs"`: processed; in server mode the server's `--logprobs-mode`
decides, which the trainer does not know: None. Without vLLM: processed (TRL's own generation;
it returns no μ, so the run's mu_logp is null anyway). The kinds of log μ:
trustlens.integrations.engines.sampling."""

from __future__ import annotations

from typing import Any

from trustlens.core.argument_checks import check_attributes
from trustlens.integrations.engines.sampling import FILTERS, active_processors, checked_sampling


def trl_sampling(args: Any) -> dict[str, Any]:
    """`sampling` of a TRL GRPOConfig (module docstring)."""
    check_attributes("args", args, ("temperature",), "a TRL GRPOConfig")
    overrides = getattr(args, "generation_kwargs", None) or {}

    def get(key: str) -> Any:
        return overrides.get(key, getattr(args, key, None))

    sampling = {key: get(key) for key in FILTERS}
    if not getattr(args, "use_vllm", False):
        logprobs: str | None = "processed"
    else:
        logprobs = "processed" if getattr(args, "vllm_mode", "server") == "colocate" else None
    return checked_sampling({**sampling, "logprobs": logprobs, "processors": active_processors(get)})


__all__ = ["trl_sampling"]
