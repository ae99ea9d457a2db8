"""SGLang's `/generate` responses as what `TokenRecorder.record` takes: `from_sglang`
(trustlens.integrations.engines says what it reads)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trustlens.core.argument_checks import check_optional_int, check_sequence
from trustlens.integrations.engines.fields import flat_top, has_flat_top, sampling_logprobs, supports, weight_versions
from trustlens.integrations.engines.routing import routed_tensor, sglang_routed
from trustlens.integrations.engines.tokens import EngineTokens, Response, log_prob, padded, token_id


def from_sglang(
    responses: Sequence[Mapping[str, Any]] | Mapping[str, Any],
    *,
    topk: int | None = None,
    pad_id: int = 0,
    length: int | None = None,
    processed: bool = False,
    routed_experts_shape: tuple[int, int] | None = None,
    routed_experts_start_len: int = 0,
) -> EngineTokens:
    """`EngineTokens` of SGLang /generate responses (module docstring): one dict or a list of
    them. topk: K of μ's top-K to return (None: none); length: pad to this T; processed: log μ
    from meta_info.output_token_sampling_logprobs (the processed μ, `return_sampling_mask`)
    instead of output_token_logprobs (tempered by default). routed_experts_shape: (num_layers,
    top_k) of meta_info.routed_experts in its base64 form; routed_experts_start_len: the
    request's (trustlens.integrations.engines.routing)."""
    check_optional_int("topk", topk, low=1)
    if isinstance(responses, Mapping):
        responses = [responses]
    responses = check_sequence("responses", responses, what="an SGLang /generate response (a dict) or a list of them")
    rows: list[Response] = []
    routed = []  # per response its [n, L, k] routed experts, or None
    for b, response in enumerate(responses):
        meta = response.get("meta_info") if isinstance(response, Mapping) else None
        if not isinstance(meta, Mapping) or meta.get("output_token_logprobs") is None:
            raise ValueError(
                f"response {b} has no meta_info.output_token_logprobs: call /generate with return_logprob=true"
            )
        tokens = meta["output_token_logprobs"]
        ids = [token_id(f"response {b}, position {t}", entry[1]) for t, entry in enumerate(tokens)]
        masks = meta.get("output_token_sampling_mask")
        if processed:
            logps = sampling_logprobs(f"response {b}", meta.get("output_token_sampling_logprobs"), masks, ids)
        else:
            logps = [log_prob(f"response {b}, position {t}", entry[0]) for t, entry in enumerate(tokens)]
        candidates = _sglang_candidates(b, meta, len(ids), topk)
        sizes = supports(f"response {b}", masks, ids)
        versions = meta.get("weight_versions") or meta.get("weight_version")
        rows.append((ids, logps, candidates, sizes, weight_versions(f"response {b}", versions, len(ids))))
        where = f"response {b}"
        routed.append(sglang_routed(where, meta, len(ids), routed_experts_start_len, routed_experts_shape))
    tokens = padded(rows, topk=topk, pad_id=pad_id, length=length)
    tokens.mu_routed_experts = routed_tensor(routed, tokens.token_ids.shape[1])
    return tokens


def _sglang_candidates(b: int, meta: Mapping[str, Any], n: int, topk: int | None) -> list[list[tuple[int, float]]]:
    """Per position the (id, log μ) candidates of response `b`: nested or flat top-logprobs."""
    if has_flat_top(meta):
        return flat_top(f"response {b}", meta, n)
    top = meta.get("output_top_logprobs")
    if topk is not None and top is None:
        raise ValueError(
            f"response {b} has no meta_info.output_top_logprobs (nested or flat): call /generate with "
            "top_logprobs_num=K"
        )
    if top is not None and len(top) != n:
        raise ValueError(f"response {b} has {n} output tokens but output_top_logprobs for {len(top)}")
    return [
        [
            (token_id(f"response {b}, position {t}", e[1]), log_prob(f"response {b}, position {t}", e[0]))
            for e in pos or ()
        ]
        for t, pos in enumerate(top or [None] * n)
    ]


__all__ = ["from_sglang"]
