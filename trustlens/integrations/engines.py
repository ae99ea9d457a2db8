"""The rollout engines' own outputs as what `TokenRecorder.record` takes: vLLM's and SGLang's.

    from trustlens.integrations.engines import from_vllm, vllm_sampling
    outputs = llm.generate(prompts, SamplingParams(temperature=0.7, logprobs=20))
    mu = from_vllm(outputs, topk=20)
    recorder = TokenRecorder(path, sampling=vllm_sampling(params, "processed_logprobs"))
    recorder.record(step, **mu.record_args(), pi_logp=..., advantages=...)

- `from_vllm(outputs)`: vLLM's `RequestOutput`s (every one of their `.outputs`, in order) or
  `CompletionOutput`s. Per response it reads `token_ids` and `logprobs`, a list with one
  {token_id: Logprob(logprob, rank, decoded_token)} per generated token (vllm/logprobs.py:
  `SampleLogprobs`; the `FlatLogprobs` container of recent versions reads the same). vLLM always
  puts the sampled token in that position's dict, beside the `SamplingParams(logprobs=K)` most
  likely ones; a dict without it means the outputs and the ids do not belong together, and is a
  ValueError naming the response and the position. With `SamplingParams(logprob_token_ids=[…])`
  the dict holds the ids the user chose, ranked by their place in that list, not μ's top-K: pass
  `params=` and `topk` is refused; without `params`, ranks out of the order of the log-probs are
  refused. The engine's `logprobs_mode` "raw_logits" / "processed_logits" returns logits: refused.
  Also read where present: `sampling_mask` (`return_sampling_mask`) and the weight versions
  (`weight_versions` or `weight_version` of the CompletionOutput, else of its RequestOutput).
- `from_sglang(responses)`: SGLang `/generate` JSON (`return_logprob=True`, `top_logprobs_num=K`),
  one dict per response (or one dict): `meta_info.output_token_logprobs` is a list of
  [logprob, token_id, text] per generated token (text is null unless `return_text_in_logprobs`),
  `meta_info.output_top_logprobs` per token a list of such triples, most likely first, or the
  flat arrays of `return_flat_raw_output_top_logprobs` (plain or base64). `processed=True` reads
  log μ from `output_token_sampling_logprobs` (`return_sampling_mask`). Also read where present:
  `output_token_sampling_mask`, `weight_versions` / `weight_version`.

Both return `EngineTokens` (trustlens.integrations.engine_tokens: shapes and pad values; the
sampling masks' support sizes and the weight versions are in it; trustlens.integrations.engine_fields:
how they are read). The log-probs are the engine's, of the kind its settings made them (raw,
tempered or processed: trustlens.integrations.engines_sampling); `vllm_sampling` and
`sglang_sampling` give TokenRecorder's `sampling` from the engines' settings.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from trustlens.core.values import check_optional_int, check_sequence
from trustlens.integrations.engine_fields import (
    flat_top,
    has_flat_top,
    sampling_logprobs,
    supports,
    weight_versions,
)
from trustlens.integrations.engine_tokens import EngineTokens, Response, log_prob, padded, token_id
from trustlens.integrations.engines_sampling import (
    VLLM_LOGPROBS_MODES,
    check_vllm_logprobs_mode,
    sglang_sampling,
    vllm_sampling,
)

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
    return padded(responses, topk=topk, pad_id=pad_id, length=length)


def from_sglang(
    responses: Sequence[Mapping[str, Any]] | Mapping[str, Any],
    *,
    topk: int | None = None,
    pad_id: int = 0,
    length: int | None = None,
    processed: bool = False,
) -> EngineTokens:
    """`EngineTokens` of SGLang /generate responses (module docstring): one dict or a list of
    them. topk: K of μ's top-K to return (None: none); length: pad to this T; processed: log μ
    from meta_info.output_token_sampling_logprobs (the processed μ, `return_sampling_mask`)
    instead of output_token_logprobs (tempered by default)."""
    check_optional_int("topk", topk, low=1)
    if isinstance(responses, Mapping):
        responses = [responses]
    responses = check_sequence("responses", responses, what="an SGLang /generate response (a dict) or a list of them")
    rows: list[Response] = []
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
    return padded(rows, topk=topk, pad_id=pad_id, length=length)


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


__all__ = [
    "VLLM_LOGPROBS_MODES",
    "EngineTokens",
    "from_sglang",
    "from_vllm",
    "sglang_sampling",
    "vllm_sampling",
]
