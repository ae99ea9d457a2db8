"""run.json `sampling` (TokenRecorder's `sampling=`) of an OpenRLHF run, from the trainer's
`generate_kwargs` (temperature, top_p; 0.11 sets no top_k or min_p); OpenRLHF gives vLLM no
`logprobs_mode`, so μ is vLLM V1's default: raw. The kinds of log μ:
trustlens.integrations.engines.sampling."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trustlens.core.argument_checks import check_type
from trustlens.integrations.engines.sampling import FILTERS, active_processors, checked_sampling


def openrlhf_sampling(generate_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """`sampling` of an OpenRLHF trainer's `generate_kwargs` (module docstring)."""
    check_type("generate_kwargs", generate_kwargs, Mapping, "the trainer's generate_kwargs mapping")
    sampling = {key: generate_kwargs.get(key) for key in FILTERS}
    return checked_sampling({**sampling, "logprobs": "raw", "processors": active_processors(generate_kwargs.get)})


__all__ = ["openrlhf_sampling"]
