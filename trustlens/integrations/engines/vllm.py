"""vLLM's outputs as what `TokenRecorder.record` takes: `from_vllm` (trustlens.integrations.engines
says what it reads)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from trustlens.core.argument_checks import check_optional_int
from trustlens.integrations.engines.fields import supports, weight_versions
from trustlens.integrations.engines.routing import routed_tensor, vllm_routed
from trustlens.integrations.engines.sampling import check_vllm_logprobs_mode
from trustlens.integrations.engines.tokens import EngineTokens, Response, log_prob, padded, token_id

RANK_SLACK = 1e-3  # nats: a candidate ranked after another may be this much more likely (rounding)
_LOGITS_HINT = (
    " (vLLM's logprobs_mode 'raw_logits' / 'processed_logits' returns logits: serve it with "
    "'processed_logprobs' or 'raw_logprobs')"
)


def from_vllm(
    outputs: Sequence[Any],
    *,
    topk: int | None = None,
    pad_id: int = 0,
    length: int | None = None,
    params: Any = None,
    logprobs_mode: str | None = None,
) -> EngineTokens:
    """`EngineTokens` of vLLM's RequestOutputs or CompletionOutputs (module docstring). topk: K
    of μ's top-K to return (None: none); length: pad to this T (≥ the longest response); params:
    the SamplingParams the outputs were made with (None: not known); logprobs_mode: the engine's
    (None: not known; a "…_logits" mode is refused)."""
    check_optional_int("topk", topk, low=1)
    check_vllm_logprobs_mode(logprobs_mode)
    if topk is not None and getattr(params, "logprob_token_ids", None):
        raise ValueError(
            "topk was asked of outputs made with SamplingParams(logprob_token_ids=…): their dicts hold the "
            "chosen ids, not μ's top-K; ask SamplingParams(logprobs=K) for the top-K, or pass topk=None"
        )
    responses: list[Response] = []
    routed = []  # per response its [n, L, k] routed experts, or None
    for b, (completion, request) in enumerate(_vllm_completions(outputs)):
        ids = [token_id(f"outputs[{b}].token_ids", i) for i in completion.token_ids]
        positions = completion.logprobs
        if positions is None:
            raise ValueError(
                f"response {b} has logprobs=None: ask vLLM for them (SamplingParams(logprobs=K), "
                "K = 0 for the sampled token's alone)"
            )
        if len(positions) != len(ids):
            raise ValueError(f"response {b} has {len(ids)} token_ids but logprobs for {len(positions)} positions")
        logps, candidates = [], []
        for t, (token, entry) in enumerate(zip(ids, positions, strict=True)):
            where = f"response {b}, position {t}"
            if entry is None or token not in entry:
                raise ValueError(
                    f"{where}: the logprobs lack the sampled token {token} (vLLM always "
                    "includes it): are these logprobs of another output?"
                )
            logps.append(log_prob(where, entry[token].logprob, _LOGITS_HINT))
            # most likely first: by rank where vLLM gave one, else by log-prob
            ranked = sorted(entry.items(), key=lambda kv: (_rank(kv[1]), -float(kv[1].logprob)))
            candidates.append([(int(i), log_prob(where, lp.logprob, _LOGITS_HINT)) for i, lp in ranked])
            _check_mass(where, candidates[-1])
            if topk is not None:
                _check_ranked(where, candidates[-1])
        sizes = supports(f"response {b}", getattr(completion, "sampling_mask", None), ids)
        versions = weight_versions(f"response {b}", _vllm_versions(completion, request), len(ids))
        responses.append((ids, logps, candidates, sizes, versions))
        routed.append(vllm_routed(f"response {b}", completion, request, len(ids)))
    tokens = padded(responses, topk=topk, pad_id=pad_id, length=length)
    tokens.mu_routed_experts = routed_tensor(routed, tokens.token_ids.shape[1])
    return tokens


def _vllm_versions(completion: Any, request: Any) -> Any:
    """The weight versions of a completion: its own `weight_versions` or `weight_version`, else
    its RequestOutput's (a version bound to the request); None when neither has one."""
    for holder in (completion, request):
        for name in ("weight_versions", "weight_version"):
            value = getattr(holder, name, None)
            if value is not None:
                return value
    return None


def _vllm_completions(outputs: Sequence[Any]) -> list[tuple[Any, Any]]:
    """Every CompletionOutput with its RequestOutput (None when given bare): those of each
    RequestOutput in order, or the outputs themselves."""
    if isinstance(outputs, (str, bytes, Mapping)) or not isinstance(outputs, Sequence):
        raise ValueError(
            f"outputs must be a list of vLLM RequestOutputs or CompletionOutputs, got {type(outputs).__name__}"
        )
    completions: list[tuple[Any, Any]] = []
    for i, out in enumerate(outputs):
        if hasattr(out, "outputs"):
            completions.extend((completion, out) for completion in out.outputs)
        elif hasattr(out, "token_ids") and hasattr(out, "logprobs"):
            completions.append((out, None))
        else:
            raise ValueError(
                f"outputs[{i}] is a {type(out).__name__}, not a vLLM RequestOutput (with .outputs) or "
                "CompletionOutput (with .token_ids and .logprobs)"
            )
    return completions


def _rank(logprob: Any) -> float:
    rank = getattr(logprob, "rank", None)
    return math.inf if rank is None else float(rank)


def _check_mass(where: str, candidates: list[tuple[int, float]]) -> None:
    """ValueError when the candidates' probabilities add up to more than 1: logits, not log-probs."""
    mass = math.fsum(math.exp(lp) for _, lp in candidates)
    if mass > math.exp(RANK_SLACK):
        raise ValueError(f"{where}: the returned log-probabilities add up to probability {mass:.3g} > 1{_LOGITS_HINT}")


def _check_ranked(where: str, candidates: list[tuple[int, float]]) -> None:
    """ValueError when a candidate is ranked after a less likely one: not μ's top-K."""
    for (_, before), (i, after) in itertools.pairwise(candidates):
        if after > before + RANK_SLACK:
            raise ValueError(
                f"{where}: id {i} is ranked after a less likely id, so these logprobs are not μ's top-K "
                "(SamplingParams(logprob_token_ids=…) ranks the chosen ids by their place in the list): ask "
                "SamplingParams(logprobs=K), or pass topk=None"
            )


__all__ = ["RANK_SLACK", "from_vllm"]
